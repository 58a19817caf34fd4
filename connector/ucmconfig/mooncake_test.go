package ucmconfig

import (
	"errors"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

// TestMooncakeTierYAML: a mooncake tier's mapping is decoded with its sizes in units, and an
// unknown key, a bad size, a mapping of the wrong kind or a missing mapping is refused.
func TestMooncakeTierYAML(t *testing.T) {
	c, err := ParseConfig(connectorDoc(`      tiers:
        - {name: dram, kind: memory, capacity: 1GiB}
        - name: pool
          kind: mooncake
          mooncake:
            local_hostname: 127.0.0.1
            metadata_server: http://127.0.0.1:8080/metadata
            master_server_address: 127.0.0.1:50051
            global_segment_size: 3GiB
            local_buffer_size: 16MiB
            protocol: tcp
            object: shard
        - {name: ssd, kind: disk, paths: [/tmp/ucm-yaml-test]}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	m := opts.Tiers[1].Mooncake
	if opts.Tiers[1].Kind != tiers.KindMooncake || m == nil || m.GlobalSegmentSize != 3<<30 || m.LocalBufferSize != 16<<20 || m.Object != "shard" || m.MasterServerAddress != "127.0.0.1:50051" {
		t.Fatalf("parsed %+v %+v", opts.Tiers[1], m)
	}
	if err := tiers.Validate(opts.Tiers); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{
		"      tiers:\n        - {name: p, kind: mooncake, mooncake: {master_server: x}}\n        - {name: ssd, kind: disk, paths: [/x]}\n",
		"      tiers:\n        - {name: p, kind: mooncake, mooncake: {global_segment_size: lots}}\n        - {name: ssd, kind: disk, paths: [/x]}\n",
		"      tiers:\n        - {name: p, kind: mooncake, mooncake: [1]}\n        - {name: ssd, kind: disk, paths: [/x]}\n",
		"      tiers:\n        - {name: p, kind: mooncake}\n        - {name: ssd, kind: disk, paths: [/x]}\n",
	} {
		if _, err := ParseConfig(connectorDoc(bad)); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%q: got %v", bad, err)
		}
	}
}
