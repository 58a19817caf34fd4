package ucmconfig

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
)

// numericKey is one numeric key of a configuration, where it sits and the form it takes.
type numericKey struct {
	where string // "connector", "top", "tier" or "mooncake"
	name  string
	form  numForm
}

// numericKeyDoc is a configuration giving one key the value as written, in a context that is
// otherwise valid (a store directory, a disk or mooncake tier around tier keys).
func numericKeyDoc(k numericKey, value string) string {
	conn := "ucm_connectors:\n  - ucm_connector_name: UcmPosixStore\n    ucm_connector_config:\n      storage_backends: /a\n"
	switch k.where {
	case "top":
		return fmt.Sprintf("%s: %s\n", k.name, value) + conn
	case "tier":
		return conn + fmt.Sprintf("      tiers:\n        - {name: t, kind: disk, paths: [/a], %s: %s}\n", k.name, value)
	case "mooncake":
		return conn + "      tiers:\n        - {name: m, kind: mooncake, mooncake: {master_server_address: 'h:1', metadata_server: 'http://h/m', " +
			fmt.Sprintf("%s: %s}}\n        - {name: d, kind: disk, paths: [/a]}\n", k.name, value)
	}
	if k.name == "tensor_size_list" {
		value = "[4096, " + value + "]"
	}
	return conn + fmt.Sprintf("      %s: %s\n", k.name, value)
}

// allNumericKeys lists every numeric key a configuration can hold, found by reflection (the
// fields of ConnectorParams, tiers.Config and tiers.MooncakeConfig with a numeric type) and from
// UCMKeys (the keys without a field that take a number), so that a key added later is covered.
func allNumericKeys(t *testing.T) []numericKey {
	t.Helper()
	var out []numericKey
	sizes := map[string]bool{"capacity": true}
	for k := range mooncakeSizeKeys {
		sizes[k] = true
	}
	add := func(where string, typ reflect.Type) {
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			ft := f.Type
			if ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
				ft = ft.Elem()
			}
			var form numForm
			switch {
			case ft == reflect.TypeOf(Size(0)) || sizes[name]:
				form = numSize
			case ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Uint64:
				form = numWhole
			case ft.Kind() == reflect.Float32 || ft.Kind() == reflect.Float64:
				form = numReal
			default:
				continue
			}
			out = append(out, numericKey{where, name, form})
		}
	}
	add("connector", reflect.TypeOf(ConnectorParams{}))
	add("tier", reflect.TypeOf(tiers.Config{}))
	add("mooncake", reflect.TypeOf(tiers.MooncakeConfig{}))
	for _, k := range UCMKeys {
		if k.kind != kindInt && k.kind != kindNumber {
			continue
		}
		where := "connector"
		if k.Scope == ScopeTop {
			where = "top"
		}
		if where == "connector" && slicesContains(connectorFields, k.Name) {
			continue // a field, listed above
		}
		form := numWhole
		if k.kind == kindNumber {
			form = numReal
		}
		out = append(out, numericKey{where, k.Name, form})
	}
	if len(out) < 40 {
		t.Fatalf("only %d numeric keys found", len(out))
	}
	return out
}

func slicesContains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Every numeric key refuses a fraction where it takes a whole number, and a value beyond what
// it can hold (as written, before any conversion: an overflow after a unit is applied is out of
// range too), with an error naming the key and the value as written.
func TestConfigNumericValues(t *testing.T) {
	bad := map[numForm][]string{
		numWhole: {"1.5", "-0.5", "9223372036854775808", "1e300", "-1e300", ".inf", ".nan", "12abc"},
		numReal:  {"1e400", ".inf", "-.inf", ".nan", "lots"},
		numSize:  {"1.5", "1.5GiB", "1e300", "99999999999999999999", "9999999TiB", "-1"},
	}
	// Values that fit the key's Go type but not what it is converted to, or the range that
	// the store takes.
	beyond := map[string][]string{
		"timeout_ms":                       {"9223372036854775807", "9223372036855"},
		"sync_interval_ms":                 {"9223372036854775807", "86400001"},
		"posix_gc_check_interval_sec":      {"9223372036854775807", "9223372037"},
		"posix_capacity_gb":                {"1e300", "8589934592", "-1"},
		"cache_buffer_capacity_gb":         {"1e300", "8589934592", "-1"},
		"queue_depth":                      {"4097", "-1", "9223372036854775807"},
		"posix_data_trans_concurrency":     {"4097", "-1"},
		"metrics_port":                     {"65536", "-1"},
		"posix_gc_trigger_threshold_ratio": {"1.5", "-0.1"},
		"posix_gc_recycle_percent":         {"1.5", "-0.1"},
		"compress_min_saving":              {"1.5", "-0.1"},
		"tp_size":                          {"-1", "4294967296"},
		"block_tokens":                     {"-1", "4294967296"},
		"device_id":                        {"4294967296"},
		"tensor_size_list":                 {"0", "-4096"},
		"replica_num":                      {"1e300"},
		"health_interval_ms":               {"9223372036854775807"},
	}
	for _, k := range allNumericKeys(t) {
		values := append(append([]string(nil), bad[k.form]...), beyond[k.name]...)
		for _, v := range values {
			doc := numericKeyDoc(k, v)
			_, err := ParseConfig([]byte(doc))
			if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), k.name) || !strings.Contains(err.Error(), v) {
				t.Errorf("%s %s: %s: %v (want engine.ErrInvalidArgument naming the key and %q)", k.where, k.name, v, err, v)
			}
		}
	}
	// The named cases of the report, with what the message says.
	for line, want := range map[string]string{
		"queue_depth: 1.5":                `queue_depth "1.5": not a whole number`,
		"timeout_ms: 9223372036854775807": `timeout_ms "9223372036854775807": out of range`,
		"posix_capacity_gb: 1e300":        `posix_capacity_gb "1e300": out of range`,
		"tensor_size_list: [4096, 2.5]":   `tensor_size_list[1] "2.5": not a whole number`,
		"segment_size: 1.5GiB":            `segment_size: size "1.5GiB": not a whole number`,
		"posix_lookup_concurrency: 2.5":   `posix_lookup_concurrency "2.5": not a whole number`,
		"tiers: [{name: d, kind: disk, paths: [/a], high_watermark: .nan}]": `high_watermark ".nan": not a finite number`,
	} {
		_, err := ParseConfig(connectorDoc("      storage_backends: /a\n      " + line + "\n"))
		if !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v (want %q)", line, err, want)
		}
	}
}

// Whole numbers written as floats (1e3, 64.0), and values at the edge of each range, are
// taken at their value.
func TestConfigNumericValuesAccepted(t *testing.T) {
	c, err := ParseConfig(connectorDoc(`      storage_backends: /a
      queue_depth: 1e3
      timeout_ms: 9223372036854
      sync_interval_ms: 86400000
      posix_gc_check_interval_sec: 9223372036
      posix_capacity_gb: 8589934591
      posix_data_trans_concurrency: 4096.0
      metrics_port: 65535
      tensor_size_list: [4096, 8.192e3]
      device_id: -1
      stream_number: 1e2
      compress_min_saving: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Connectors[0].Config
	if p.QueueDepth != 1000 || p.TimeoutMs != 9223372036854 || p.PosixDataTransConcurrency != 4096 ||
		p.TensorSizeList[1] != 8192 || *p.DeviceID != -1 || p.PosixCapacityGB != 8589934591 {
		t.Fatalf("values %+v", p)
	}
	_, opts, err := c.StoreOptions()
	if err != nil {
		t.Fatal(err)
	}
	if opts.TaskTimeout <= 0 || opts.CompactInterval <= 0 || opts.Tiers[0].Capacity <= 0 {
		t.Fatalf("conversions overflowed: timeout %v compact %v capacity %d", opts.TaskTimeout, opts.CompactInterval, opts.Tiers[0].Capacity)
	}
}

// A Config built in Go (not parsed) is held to the same ranges by ApplyEnv's validation.
func TestConfigNumericValuesValidated(t *testing.T) {
	for name, set := range map[string]func(*ConnectorParams){
		"timeout_ms":               func(p *ConnectorParams) { p.TimeoutMs = 1 << 62 },
		"posix_capacity_gb":        func(p *ConnectorParams) { p.PosixCapacityGB = 1e300 },
		"cache_buffer_capacity_gb": func(p *ConnectorParams) { p.CacheBufferCapacityGB = 1e300 },
		"queue_depth":              func(p *ConnectorParams) { p.QueueDepth = 1 << 20 },
		"tensor_size_list":         func(p *ConnectorParams) { p.TensorSizeList = []int64{4096, -1} },
	} {
		c := &Config{Connectors: []ConnectorConfig{{Name: "x", Config: ConnectorParams{StorageBackends: Paths{"/a"}}}}}
		set(&c.Connectors[0].Config)
		if err := c.ApplyEnv(func(string) string { return "" }); !errors.Is(err, engine.ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
}
