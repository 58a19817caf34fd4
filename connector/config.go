package connector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
	"gopkg.in/yaml.v3"
)

// StoreConfig is a store's configuration as the connector reads it: the parsed UCM
// configuration and what it derives from the keys UCM's connector adds (the transfer shape and
// the worker's identity).
type StoreConfig struct {
	// Config is the parsed configuration (ucmconfig.ParseConfig, environment applied).
	Config *ucmconfig.Config
	// Params is its first connector's ucm_connector_config.
	Params ucmconfig.ConnectorParams
	// Tensors are the bytes behind each address of a shard, in order (tensor_size_list, or
	// shard_size / tensor_size copies of tensor_size); they sum to Layout.ShardBytes. Empty for
	// the scheduler.
	Tensors []int64
	// Layout is the store's block layout; Schema what the bytes are.
	Layout engine.Layout
	Schema engine.Schema
	// Scheduler says the configuration gives no transfer shape and no device: UCM's scheduler,
	// which only looks up. Its store is lookup-only (engine.Options.LookupOnly).
	Scheduler bool
	// Instance is the process's instance name on the shared storage_backends (the store
	// directory <backend>/stores/<layout namespace>/<Instance>): the instance key, else
	// <host>-rank<device_id> for a worker, <host>-nodevice for a store with a transfer shape and
	// no device_id (or a negative one), and <host>-scheduler for the scheduler.
	Instance string
	// MetricsListen is the address the metrics endpoint listens on ("" off): metrics_address
	// (or UCM_METRICS_ADDRESS; default 127.0.0.1) and metrics_port (or UCM_METRICS_PORT, or
	// DefaultMetricsPort with UCM_METRICS_ENABLE), plus 1 + device_id for a store with a
	// device (device_id >= 0), so that the scheduler and every worker process of a host serve
	// their own. A store without a device (device_id absent or negative: UCM's scheduler,
	// also when it is given a transfer shape) serves on metrics_port itself, never on a
	// worker's port.
	MetricsListen string
	// MetricsFrom says how MetricsListen's port was derived, for error messages.
	MetricsFrom string
	// WorkerID is the worker_id label of every metric series of the store, with the meaning
	// UCM's connector gives it: the worker's rank (device_id: the local rank UCM's connector
	// passes, which is the rank on a one-host deployment) for a store with a device, and the
	// engine id (unique_id, which UCM's connector sets to vLLM's engine_id) for one without;
	// "scheduler" when neither is given.
	WorkerID string
	// ModelName is the model_name label of the ucm: metrics: model_name, else model, else
	// DefaultModel.
	ModelName string
	// ShmDir is the directory under which Empty and Cache|Empty stores keep their files
	// (store_pipeline; Open): UCMGO_SHM_DIR, else DefaultShmDir.
	ShmDir string
}

// DefaultMetricsPort is the metrics port when UCM_METRICS_ENABLE turns the endpoint on without
// a port.
const DefaultMetricsPort = 9400

// DefaultModel and DefaultKVLayout are the schema's model and layout when the configuration
// names none: UCM's block ids already hash the model, TP size, dtype and rank, so a store of
// UCM ids is keyed by them; the schema then only pins the transfer shape.
const (
	DefaultModel    = "ucm-block-ids"
	DefaultKVLayout = "ucm"
)

// configKeys are top-level keys of a full UCM configuration (ucmconfig.UCMKeys of the top level);
// a document with none of them is a flat ucm_connector_config mapping, as UCM's store factory
// hands it to a store.
var configKeys = func() []string {
	var out []string
	for _, k := range ucmconfig.UCMKeys {
		if k.Scope == ucmconfig.ScopeTop {
			out = append(out, k.Name)
		}
	}
	return out
}()

// ParseStoreConfig reads a store configuration from text: a YAML (or JSON) document, or the
// path of a file holding one; empty text reads the file UCM_CONFIG_FILE names. The document is
// either a whole UCM configuration (ucm_connectors: [...]) or the flat ucm_connector_config
// mapping UCM's connector passes to a store's constructor. getenv supplies UCM's environment
// overrides (os.Getenv in production).
func ParseStoreConfig(text string, getenv func(string) string) (*StoreConfig, error) {
	data, where, err := readConfigText(text, getenv)
	if err != nil {
		return nil, err
	}
	if data, err = fromJSON(data); err != nil {
		return nil, fmt.Errorf("config %s: %w", where, err)
	}
	var top map[string]yaml.Node
	if err := yaml.Unmarshal(data, &top); err != nil {
		return nil, fmt.Errorf("config %s: not a YAML mapping: %v: %w", where, err, engine.ErrInvalidArgument)
	}
	full := false
	for _, k := range configKeys {
		if _, ok := top[k]; ok {
			full = true
		}
	}
	if !full && len(top) > 0 {
		var b bytes.Buffer
		b.WriteString("ucm_connectors:\n  - ucm_connector_name: UcmGoStore\n    ucm_connector_config:\n")
		for _, line := range strings.Split(string(bytes.TrimRight(data, "\n")), "\n") {
			b.WriteString("      " + line + "\n")
		}
		data = b.Bytes()
	}
	c, err := ucmconfig.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", where, err)
	}
	if err := c.ApplyEnv(getenv); err != nil {
		return nil, fmt.Errorf("config %s: %w", where, err)
	}
	sc := &StoreConfig{Config: c, Params: c.Connectors[0].Config}
	if err := sc.derive(getenv); err != nil {
		return nil, fmt.Errorf("config %s: %w", where, err)
	}
	return sc, nil
}

// fromJSON returns a JSON object document as YAML with the same content, decoded by JSON's
// rules, and any other document as it is. YAML 1.2 reads most JSON itself, but not all of it:
// a character outside the Basic Multilingual Plane escaped as JSON escapes it, a UTF-16
// surrogate pair ("\ud83d\ude00", as Python's json.dumps writes an emoji), is refused or
// mangled by the YAML decoder, so a path with one would not reach the store.
func fromJSON(data []byte) ([]byte, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(trimmed) {
		return data, nil
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not a JSON object: %v: %w", err, engine.ErrInvalidArgument)
	}
	out, err := yaml.Marshal(plainNumbers(doc))
	if err != nil {
		return nil, fmt.Errorf("JSON document as YAML: %v: %w", err, engine.ErrInvalidArgument)
	}
	return out, nil
}

// plainNumbers replaces the json.Numbers of a decoded JSON value by int64 (integers that fit)
// or float64, which the YAML encoder writes as numbers.
func plainNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = plainNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = plainNumbers(e)
		}
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		if f, err := x.Float64(); err == nil {
			return f
		}
		return x.String()
	}
	return v
}

// readConfigText returns the document and a name for it in errors.
func readConfigText(text string, getenv func(string) string) ([]byte, string, error) {
	if strings.TrimSpace(text) == "" {
		path := getenv("UCM_CONFIG_FILE")
		if path == "" {
			return nil, "", fmt.Errorf("config: empty, and UCM_CONFIG_FILE is not set: %w", engine.ErrInvalidArgument)
		}
		text = path
	}
	if looksLikeFile(text) || !strings.ContainsAny(text, "\n{[:") {
		data, err := os.ReadFile(text)
		if err != nil {
			return nil, "", fmt.Errorf("config file %s: %w: %w", text, err, engine.ErrInvalidArgument)
		}
		return data, text, nil
	}
	return []byte(text), "(text)", nil
}

// looksLikeFile: a one-line text naming an existing regular file ("/etc/ucm.yaml" has no
// newline; "C:" style paths do not occur here).
func looksLikeFile(text string) bool {
	if strings.Contains(text, "\n") {
		return false
	}
	st, err := os.Stat(text)
	return err == nil && st.Mode().IsRegular()
}

// derive fills the transfer shape, role, schema and instance name from the keys.
func (sc *StoreConfig) derive(getenv func(string) string) error {
	p := sc.Params
	device := -1
	if p.DeviceID != nil {
		device = *p.DeviceID
	}
	shard := int64(p.ShardSize)
	switch {
	case len(p.TensorSizeList) > 0:
		sc.Tensors = append([]int64(nil), p.TensorSizeList...)
	case p.TensorSize > 0 && shard > 0:
		if shard%int64(p.TensorSize) != 0 {
			return fmt.Errorf("shard_size %d is not a multiple of tensor_size %d: %w", shard, p.TensorSize, engine.ErrInvalidArgument)
		}
		for range shard / int64(p.TensorSize) {
			sc.Tensors = append(sc.Tensors, int64(p.TensorSize))
		}
	case p.TensorSize > 0:
		sc.Tensors = []int64{int64(p.TensorSize)}
	}
	if len(sc.Tensors) == 0 && shard > 0 {
		sc.Tensors = []int64{shard} // one address per shard
	}
	var sum int64
	for _, n := range sc.Tensors {
		sum += n
	}
	if shard == 0 {
		shard = sum
	}
	block := int64(p.BlockSize)
	if shard > 0 && block == 0 {
		block = shard
	}
	switch {
	case shard == 0 && device >= 0:
		return fmt.Errorf("device_id %d (a worker) without shard_size, tensor_size or tensor_size_list: %w", device, engine.ErrInvalidArgument)
	case shard == 0:
		sc.Scheduler = true
	case sum != shard:
		return fmt.Errorf("tensor sizes %v sum to %d, not shard_size %d: %w", sc.Tensors, sum, shard, engine.ErrInvalidArgument)
	case block%shard != 0:
		return fmt.Errorf("block_size %d is not a multiple of shard_size %d: %w", block, shard, engine.ErrInvalidArgument)
	}
	if sc.Scheduler {
		// The scheduler's own store holds nothing: any valid layout does (block_size, when
		// given, only describes the workers' blocks).
		sc.Layout = engine.Layout{Shards: 1, TensorsPerShard: 1, ShardBytes: max(block, 1)}
	} else {
		tps := len(sc.Tensors)
		if shard%int64(tps) != 0 {
			tps = 1 // unequal tensors: the layout records one tensor, the connector the list
		}
		sc.Layout = engine.Layout{Shards: int(block / shard), TensorsPerShard: tps, ShardBytes: shard}
		if err := sc.Layout.Validate(); err != nil {
			return err
		}
	}
	sc.Schema = engine.Schema{Model: p.Model, DType: p.KVDType, KVLayout: p.KVLayout, TPSize: max(p.TPSize, 1),
		BlockTokens: max(p.BlockTokens, 1), HashScheme: engine.HashSchemeUCMPickle}
	if sc.Schema.Model == "" {
		sc.Schema.Model = DefaultModel
	}
	if sc.Schema.DType == "" {
		sc.Schema.DType = DefaultModel
	}
	if sc.Schema.KVLayout == "" {
		sc.Schema.KVLayout = DefaultKVLayout
	}
	if sc.Scheduler {
		sc.Schema.KVLayout = "scheduler"
	}
	sc.Instance = p.Instance
	if sc.Instance == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "host"
		}
		host = strings.NewReplacer("/", "_", `\`, "_").Replace(host)
		switch {
		case sc.Scheduler:
			sc.Instance = host + "-scheduler"
		case device < 0:
			// A transfer shape without a device (UCM's scheduler form with tensor sizes, or a
			// host-memory caller): never rank 0's name, which its worker would then not get.
			sc.Instance = host + "-nodevice"
		default:
			sc.Instance = fmt.Sprintf("%s-rank%d", host, device)
		}
	}
	if err := sc.deriveMetrics(device, getenv); err != nil {
		return err
	}
	sc.ShmDir = getenv("UCMGO_SHM_DIR")
	if sc.ShmDir == "" {
		sc.ShmDir = DefaultShmDir
	}
	if len(p.StorageBackends) == 0 && len(p.Tiers) == 0 && !p.KeepsNothing() && !p.CacheOnly() {
		return fmt.Errorf("storage_backends is empty (and UCM_STORAGE_PATH not set): %w", engine.ErrInvalidArgument)
	}
	return nil
}

// deriveMetrics sets MetricsListen and ModelName from the keys and UCM_METRICS_* variables.
func (sc *StoreConfig) deriveMetrics(device int, getenv func(string) string) error {
	p := sc.Params
	port, addr := p.MetricsPort, p.MetricsAddress
	if v := getenv("UCM_METRICS_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("UCM_METRICS_PORT=%q: want a port in [1, 65535]: %w", v, engine.ErrInvalidArgument)
		}
		port = n
	}
	if v := getenv("UCM_METRICS_ENABLE"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("UCM_METRICS_ENABLE=%q: want true or false: %w", v, engine.ErrInvalidArgument)
		}
		switch {
		case !on:
			port = 0
		case port == 0:
			port = DefaultMetricsPort
		}
	}
	if v := getenv("UCM_METRICS_ADDRESS"); v != "" {
		addr = v
	}
	if addr == "" {
		addr = "127.0.0.1"
	}
	if port > 0 {
		sc.MetricsFrom = fmt.Sprintf("metrics_port %d: a store without a device", port)
		if device >= 0 {
			sc.MetricsFrom = fmt.Sprintf("metrics_port %d + 1 + device_id %d", port, device)
			port += 1 + device
		}
		if port > 65535 {
			return fmt.Errorf("metrics port %d (%s) above 65535: %w", port, sc.MetricsFrom, engine.ErrInvalidArgument)
		}
		sc.MetricsListen = net.JoinHostPort(addr, strconv.Itoa(port))
	}
	switch {
	case device >= 0:
		sc.WorkerID = strconv.Itoa(device)
	case p.UniqueID != "":
		sc.WorkerID = p.UniqueID
	default:
		sc.WorkerID = "scheduler"
	}
	sc.ModelName = p.ModelName
	if sc.ModelName == "" {
		sc.ModelName = sc.Schema.Model
	}
	return nil
}
