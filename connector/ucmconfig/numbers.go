package ucmconfig

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/tiers"
	"gopkg.in/yaml.v3"
)

// numForm is the form a numeric configuration value takes.
type numForm int

const (
	// numWhole is an integer; a float literal with no fraction counts (1e3, 64.0).
	numWhole numForm = iota + 1
	// numReal is a finite number.
	numReal
	// numSize is a byte count as ParseSize reads it (digits with an optional binary unit).
	numSize
)

// numSpec is what a numeric key takes: its form and inclusive bounds in the key's own unit
// (milliseconds for timeout_ms, GiB for posix_capacity_gb). The bounds are chosen so that the
// value, converted to what the store takes (a time.Duration, a byte count), cannot overflow,
// and so that a value the store would refuse at engine.Open is refused here, naming the key.
type numSpec struct {
	form     numForm
	lo, hi   int64   // numWhole, numSize
	flo, fhi float64 // numReal
	// why says where an upper bound comes from, for the message ("" for none).
	why string
}

func wholeIn(lo, hi int64, why string) numSpec {
	return numSpec{form: numWhole, lo: lo, hi: hi, why: why}
}

func realIn(lo, hi float64, why string) numSpec {
	return numSpec{form: numReal, flo: lo, fhi: hi, why: why}
}

var (
	anyWhole = wholeIn(math.MinInt64, math.MaxInt64, "")
	anyReal  = realIn(-math.MaxFloat64, math.MaxFloat64, "")
	anySize  = numSpec{form: numSize, lo: 0, hi: math.MaxInt64}
	ratio    = realIn(0, 1, "a share")
)

// maxCapacityGB is the largest capacity in GiB whose byte count fits an int64.
const maxCapacityGB = math.MaxInt64 >> 30

// connectorNumbers are the numeric keys of ucm_connector_config that are fields of
// ConnectorParams, with what each takes. tensor_size_list's spec is that of each element.
var connectorNumbers = map[string]numSpec{
	"posix_data_trans_concurrency":     wholeIn(0, engine.MaxQueueDepth, "the largest queue depth"),
	"queue_depth":                      wholeIn(0, engine.MaxQueueDepth, "the largest queue depth"),
	"timeout_ms":                       wholeIn(0, math.MaxInt64/int64(time.Millisecond), "the milliseconds a time.Duration holds"),
	"sync_interval_ms":                 wholeIn(0, int64(engine.MaxSyncInterval/time.Millisecond), "24 h"),
	"posix_gc_check_interval_sec":      wholeIn(0, math.MaxInt64/int64(time.Second), "the seconds a time.Duration holds"),
	"device_id":                        wholeIn(math.MinInt32, math.MaxInt32, "a 32-bit device id"),
	"tp_size":                          wholeIn(0, math.MaxInt32, ""),
	"block_tokens":                     wholeIn(0, math.MaxInt32, ""),
	"metrics_port":                     wholeIn(0, 65535, "a TCP port"),
	"tensor_size_list":                 wholeIn(1, math.MaxInt64, ""),
	"posix_capacity_gb":                realIn(0, maxCapacityGB, "the GiB whose bytes fit an int64"),
	"cache_buffer_capacity_gb":         realIn(0, maxCapacityGB, "the GiB whose bytes fit an int64"),
	"posix_gc_trigger_threshold_ratio": ratio,
	"posix_gc_recycle_percent":         ratio,
	"compress_min_saving":              ratio,
	"block_size":                       anySize,
	"tensor_size":                      anySize,
	"shard_size":                       anySize,
	"segment_size":                     anySize,
	"max_staging_bytes":                anySize,
	"max_batch_bytes":                  anySize,
}

// tierNumbers are the numeric keys of a tier (capacity, a size, is read by TierList), and
// mooncakeNumbers those of its mooncake mapping that are not sizes: their ranges are
// tiers.Validate's, which names them; here they must be whole or finite numbers.
var (
	tierNumbers     = map[string]numSpec{"high_watermark": ratio, "low_watermark": ratio}
	mooncakeNumbers = func() map[string]numSpec {
		out := map[string]numSpec{}
		t := reflect.TypeOf(tiers.MooncakeConfig{})
		for i := 0; i < t.NumField(); i++ {
			name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
			switch k := t.Field(i).Type.Kind(); {
			case mooncakeSizeKeys[name]:
			case k >= reflect.Int && k <= reflect.Int64:
				out[name] = anyWhole
			case k == reflect.Float64:
				out[name] = anyReal
			}
		}
		return out
	}()
)

// want says what the spec takes, for messages.
func (s numSpec) want() string {
	switch s.form {
	case numWhole:
		return "an integer"
	case numReal:
		return "a number"
	}
	return "a size"
}

// rangeText says the bounds, for messages.
func (s numSpec) rangeText() string {
	var r string
	if s.form == numReal {
		r = fmt.Sprintf("out of range [%v, %v]", s.flo, s.fhi)
	} else {
		r = fmt.Sprintf("out of range [%d, %d]", s.lo, s.hi)
	}
	if s.why != "" {
		r += " (" + s.why + ")"
	}
	return r
}

// checkNode checks one YAML value of key against the spec. The error names the line, the
// key and the value as written; the caller wraps engine.ErrInvalidArgument. An explicit null is
// taken as absent, as the decoder takes it.
func (s numSpec) checkNode(key string, n *yaml.Node) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: %s: want %s", n.Line, key, s.want())
	}
	if n.ShortTag() == "!!null" {
		return nil
	}
	bad := func(reason string) error {
		return fmt.Errorf("line %d: %s %q: %s", n.Line, key, n.Value, reason)
	}
	if s.form == numSize {
		v, err := ParseSize(n.Value)
		if err != nil {
			return fmt.Errorf("line %d: %s: %w", n.Line, key, err)
		}
		if v < s.lo || v > s.hi {
			return bad(s.rangeText())
		}
		return nil
	}
	var v any
	if err := n.Decode(&v); err != nil {
		return bad("want " + s.want())
	}
	var f float64
	switch x := v.(type) {
	case int:
		if s.form == numWhole {
			return s.wholeRange(int64(x), bad)
		}
		f = float64(x)
	case int64:
		if s.form == numWhole {
			return s.wholeRange(x, bad)
		}
		f = float64(x)
	case uint64: // above math.MaxInt64
		if s.form == numWhole {
			return bad(s.rangeText())
		}
		f = float64(x)
	case float64:
		f = x
	case string:
		// YAML reads a float literal beyond float64 (1e400) as a string.
		if _, err := strconv.ParseFloat(strings.TrimSpace(x), 64); errors.Is(err, strconv.ErrRange) {
			return bad(s.rangeText())
		}
		return bad("want " + s.want())
	default:
		return bad("want " + s.want())
	}
	if s.form == numWhole {
		switch {
		case math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f):
			return bad("not a whole number")
		case f < -(1<<63) || f >= 1<<63:
			return bad(s.rangeText())
		}
		return s.wholeRange(int64(f), bad)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return bad("not a finite number")
	}
	if f < s.flo || f > s.fhi {
		return bad(s.rangeText())
	}
	return nil
}

func (s numSpec) wholeRange(v int64, bad func(string) error) error {
	if v < s.lo || v > s.hi {
		return bad(s.rangeText())
	}
	return nil
}

// checkNodeList checks a sequence whose elements take the spec, naming each as key[i].
func (s numSpec) checkNodeList(key string, n *yaml.Node) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.SequenceNode {
		return nil // the decoder names a scalar where a list belongs
	}
	for i, e := range n.Content {
		if err := s.checkNode(fmt.Sprintf("%s[%d]", key, i), e); err != nil {
			return err
		}
	}
	return nil
}

// mappingValue is the value of key in a mapping node (aliases followed), or nil.
func mappingValue(n *yaml.Node, key string) *yaml.Node {
	if n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for k := 0; k+1 < len(n.Content); k += 2 {
		if n.Content[k].Value == key {
			return n.Content[k+1]
		}
	}
	return nil
}

// checkConnectorNumbers checks the numeric keys of every ucm_connector_config of a parsed
// document against connectorNumbers, before the document is decoded into typed fields (which
// would take 1.5 as 1 and leave a conversion to overflow later).
func checkConnectorNumbers(doc *yaml.Node, data []byte) error {
	root := doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil
		}
		root = root.Content[0]
	}
	conns := mappingValue(root, "ucm_connectors")
	if conns != nil && conns.Kind == yaml.AliasNode {
		conns = conns.Alias
	}
	if conns == nil || conns.Kind != yaml.SequenceNode {
		return nil
	}
	for i, c := range conns.Content {
		cfg := mappingValue(c, "ucm_connector_config")
		if cfg != nil && cfg.Kind == yaml.AliasNode {
			cfg = cfg.Alias
		}
		if cfg == nil || cfg.Kind != yaml.MappingNode {
			continue
		}
		for k := 0; k+1 < len(cfg.Content); k += 2 {
			key, val := cfg.Content[k].Value, cfg.Content[k+1]
			spec, ok := connectorNumbers[key]
			if !ok {
				continue
			}
			check := spec.checkNode
			if key == "tensor_size_list" {
				check = spec.checkNodeList
			}
			if err := check(key, val); err != nil {
				return fmt.Errorf("config: ucm_connectors[%d].ucm_connector_config: %s: %w", i, quoteLines(err.Error(), data), engine.ErrInvalidArgument)
			}
		}
	}
	return nil
}

// checkParamNumbers holds a ConnectorParams built in Go (not parsed) to connectorNumbers'
// ranges, naming the key and the value.
func checkParamNumbers(p ConnectorParams) error {
	v := reflect.ValueOf(p)
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		spec, ok := connectorNumbers[name]
		if !ok {
			continue
		}
		f := v.Field(i)
		if f.Kind() == reflect.Pointer {
			if f.IsNil() {
				continue
			}
			f = f.Elem()
		}
		if f.Kind() == reflect.Slice {
			for j := 0; j < f.Len(); j++ {
				if err := spec.checkValue(fmt.Sprintf("%s[%d]", name, j), f.Index(j)); err != nil {
					return err
				}
			}
			continue
		}
		if err := spec.checkValue(name, f); err != nil {
			return err
		}
	}
	return nil
}

// checkValue checks one typed field (an integer or a float) against the spec.
func (s numSpec) checkValue(key string, f reflect.Value) error {
	switch f.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if v := f.Int(); v < s.lo || v > s.hi {
			return fmt.Errorf("%s %d: %s: %w", key, v, s.rangeText(), engine.ErrInvalidArgument)
		}
	case reflect.Float32, reflect.Float64:
		if v := f.Float(); !(v >= s.flo && v <= s.fhi) { // NaN fails too
			return fmt.Errorf("%s %v: %s: %w", key, v, s.rangeText(), engine.ErrInvalidArgument)
		}
	}
	return nil
}

// checkMooncakeNumbers checks the numeric keys of tier i's mooncake mapping that are not
// sizes (normalizeMooncakeYAML reads those).
func checkMooncakeNumbers(n *yaml.Node, i int) error {
	for k := 0; k+1 < len(n.Content); k += 2 {
		key, val := n.Content[k].Value, n.Content[k+1]
		if spec, ok := mooncakeNumbers[key]; ok {
			if err := spec.checkNode(key, val); err != nil {
				return fmt.Errorf("tiers[%d].mooncake: %w: %w", i, err, engine.ErrInvalidArgument)
			}
		}
	}
	return nil
}
