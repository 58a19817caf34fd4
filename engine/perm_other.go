//go:build !unix

package engine

import (
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fchmod: file modes are Unix permissions; elsewhere files keep the system's defaults.
func fchmod(vfs.File, os.FileMode) error { return nil }

// sameDevice: without device numbers, a directory counts as on the store's file system.
func sameDevice(a, b os.FileInfo) bool { return true }
