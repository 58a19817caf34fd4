// Package fuzz holds cross-package fuzz targets and the crash-recovery and
// fault-injection suites.
package fuzz
