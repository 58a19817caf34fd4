package cliutil

import (
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/ucm-go/ucm/connector/ucmconfig"
)

// Config holds the persistent --config flag and, for commands working on a store, --instance:
// the YAML configuration the engine runs with (UCM's file or UCM-Go's keys; default
// $UCM_CONFIG_FILE) tells a command where the store is (ucm-tool) or what to build (ucm-lab's
// bench).
type Config struct {
	// Path is --config: the configuration file ("" without one).
	Path string
	// Instance is --instance: the instance store of a process sharing storage_backends.
	Instance string
}

// Register adds --config to root's persistent flags, its help ending with what the command
// takes from the file (uses), and --instance when instance is set.
func (c *Config) Register(root *cobra.Command, uses string, instance bool) {
	fl := root.PersistentFlags()
	fl.StringVar(&c.Path, "config", os.Getenv("UCM_CONFIG_FILE"),
		"the engine's YAML configuration (UCM's file, or UCM-Go keys; default $UCM_CONFIG_FILE): "+uses)
	if instance {
		fl.StringVar(&c.Instance, "instance", "",
			"with --config: the instance store of a process sharing storage_backends (<storage_backends[0]>/stores/<layout namespace>/NAME, as the connector names them)")
	}
}

// Load parses the configuration: nil without --config, a usage error (exit status 2) naming
// --config when it does not load, or when --instance is given without it.
func (c *Config) Load() (*ucmconfig.Config, error) {
	if c.Path == "" {
		if c.Instance != "" {
			return nil, UsageErr("--instance needs --config")
		}
		return nil, nil
	}
	cfg, err := ucmconfig.LoadConfig(c.Path)
	if err != nil {
		return nil, UsageErr("--config: %v", err)
	}
	return cfg, nil
}

// StoreDir returns the store a command works on: its DIR argument, else the configuration's
// store directory (with --instance, that process's instance store).
func (c *Config) StoreDir(args []string) (string, error) {
	cfg, err := c.Load()
	if err != nil {
		return "", err
	}
	if len(args) == 1 {
		return args[0], nil
	}
	if cfg == nil {
		return "", UsageErr("no store: give DIR, or --config FILE (or set UCM_CONFIG_FILE)")
	}
	if c.Instance == "" {
		dir, _, err := cfg.StoreOptions()
		if err != nil {
			return "", UsageErr("--config %s: %v", c.Path, err)
		}
		return dir, nil
	}
	// The instance's stores, one per layout it ran with; the command adopts the stored schema.
	dirs, err := cfg.InstanceStores(c.Instance)
	if err != nil {
		return "", UsageErr("--config %s: %v", c.Path, err)
	}
	switch len(dirs) {
	case 1:
		return dirs[0], nil
	default:
		return "", UsageErr("--config %s --instance %s: the instance has a store per layout; give one as DIR: %s",
			c.Path, c.Instance, strings.Join(dirs, " "))
	}
}
