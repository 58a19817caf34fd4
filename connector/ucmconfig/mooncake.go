package ucmconfig

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
	"gopkg.in/yaml.v3"
)

// mooncakeKeys are the YAML keys of tiers.MooncakeConfig; mooncakeSizeKeys those that take a
// size with a unit.
var (
	mooncakeKeys     = yamlKeys(reflect.TypeOf(tiers.MooncakeConfig{}))
	mooncakeSizeKeys = map[string]bool{"global_segment_size": true, "local_buffer_size": true, "staging_bytes": true}
)

func yamlKeys(t reflect.Type) map[string]bool {
	keys := map[string]bool{}
	for i := 0; i < t.NumField(); i++ {
		if k, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); k != "" && k != "-" {
			keys[k] = true
		}
	}
	return keys
}

// normalizeMooncakeYAML checks the `mooncake:` mapping of tier i strictly (unknown keys are
// errors) and rewrites its sizes ("3GiB") as integers, before it is decoded.
func normalizeMooncakeYAML(n *yaml.Node, i int) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: tiers[%d].mooncake: want a mapping (master_server_address, metadata_server, ...): %w", n.Line, i, engine.ErrInvalidArgument)
	}
	for k := 0; k+1 < len(n.Content); k += 2 {
		key, val := n.Content[k], n.Content[k+1]
		if !mooncakeKeys[key.Value] {
			return fmt.Errorf("line %d: tiers[%d].mooncake: unknown key %q: %w", key.Line, i, key.Value, engine.ErrInvalidArgument)
		}
		if mooncakeSizeKeys[key.Value] && val.Kind == yaml.ScalarNode {
			v, err := ParseSize(val.Value)
			if err != nil {
				return fmt.Errorf("line %d: tiers[%d].mooncake.%s: %w", val.Line, i, key.Value, err)
			}
			val.Value, val.Tag = strconv.FormatInt(v, 10), "!!int"
		}
	}
	return nil
}
