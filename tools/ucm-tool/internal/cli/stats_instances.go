package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/connector/ucmconfig"
	"github.com/ucm-go/ucm/engine"
	"github.com/ucm-go/ucm/internal/cliutil"
	"github.com/ucm-go/ucm/tiers"
	"github.com/ucm-go/ucm/tools/verify"
)

// Instance states in the listing.
const (
	instanceStopped = "stopped" // no process holds it: read from its index
	instanceRunning = "running" // a process holds it: read from what it published
	instanceNoStore = "no store"
)

// instanceStats is one instance store of a shared storage_backends in the listing (the --json
// form has these field names).
type instanceStats struct {
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// State: "stopped" (the numbers are its index's exact accounting), "running" (a process
	// holds the store: the numbers are the segments it published in its manifests, which
	// leaves out its active segment and its live/dead split), or "no store" (a directory
	// without a store in it).
	State     string `json:"state"`
	Blocks    int64  `json:"blocks"`
	FileBytes int64  `json:"file_bytes"`
	LiveBytes *int64 `json:"live_bytes,omitempty"`
	DeadBytes *int64 `json:"dead_bytes,omitempty"`
	Segments  int    `json:"segments"`
	Error     string `json:"error,omitempty"`
}

// instancesReport is what stats prints for a storage_backends shared by instances.
type instancesReport struct {
	StorageBackends []string        `json:"storage_backends"`
	Instances       []instanceStats `json:"instances"`
	Total           instanceStats   `json:"total"`
}

// isStoreDir reports whether dir holds a store itself (its index or schema file).
func isStoreDir(dir string) bool {
	for _, name := range []string{engine.SchemaFile, engine.IndexDir} {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return true
		}
	}
	return false
}

// sharedInstances returns the storage_backends and instance names of a configuration whose
// first backend is not a store itself but holds instance stores (<backend>/stores/<layout
// namespace>/<name>, as the connector makes them, or <backend>/stores/<name> from before layout
// namespaces; names are relative to <backend>/stores); ok=false otherwise.
func sharedInstances(c *cliutil.Config) (backends, names []string, ok bool, err error) {
	cfg, err := c.Load()
	if err != nil || cfg == nil || c.Instance != "" {
		return nil, nil, false, err
	}
	base, _, err := cfg.StoreOptions()
	if err != nil || isStoreDir(base) {
		return nil, nil, false, nil
	}
	ents, err := os.ReadDir(filepath.Join(base, ucmconfig.StoresDir))
	if err != nil {
		return nil, nil, false, nil
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		if isStoreDir(filepath.Join(base, ucmconfig.StoresDir, e.Name())) {
			names = append(names, e.Name()) // a store from before layout namespaces
			continue
		}
		// A layout namespace (ucmconfig.LayoutNamespace): its instance stores.
		sub, err := os.ReadDir(filepath.Join(base, ucmconfig.StoresDir, e.Name()))
		if err != nil {
			continue
		}
		n := len(names)
		for _, s := range sub {
			if s.IsDir() {
				names = append(names, filepath.Join(e.Name(), s.Name()))
			}
		}
		if len(names) == n {
			names = append(names, e.Name()) // neither: listed as holding no store
		}
	}
	slices.Sort(names)
	backends = cfg.Connectors[0].Config.StorageBackends
	if len(backends) == 0 {
		backends = []string{base}
	}
	return backends, names, true, nil
}

// runInstanceStats lists the instance stores under backends[0]/stores and their total. It
// writes nothing: a stopped instance is opened read-only without recovery, a running one is
// not opened at all.
func runInstanceStats(backends, names []string, asJSON bool, stdout io.Writer) error {
	r := instancesReport{StorageBackends: backends, Instances: []instanceStats{}, Total: instanceStats{Name: "total"}}
	var live, dead int64
	liveKnown := true
	for _, name := range names {
		st := statInstance(filepath.Join(backends[0], ucmconfig.StoresDir, name), backends)
		st.Name = filepath.Base(name) // its directory (in st.Dir) names its layout namespace
		r.Instances = append(r.Instances, st)
		r.Total.Blocks += st.Blocks
		r.Total.FileBytes += st.FileBytes
		r.Total.Segments += st.Segments
		if st.LiveBytes != nil {
			live += *st.LiveBytes
			dead += *st.DeadBytes
		} else if st.State != instanceNoStore {
			liveKnown = false
		}
	}
	if liveKnown {
		r.Total.LiveBytes, r.Total.DeadBytes = &live, &dead
	}
	states := map[string]int{}
	for _, st := range r.Instances {
		states[st.State]++
	}
	r.Total.State = fmt.Sprintf("%d running, %d stopped", states[instanceRunning], states[instanceStopped])
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	}
	fmt.Fprintf(stdout, "storage_backends: %s (%d instance stores under %s)\n\n", strings.Join(backends, ", "), len(names),
		filepath.Join(backends[0], ucmconfig.StoresDir))
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "instance\tstate\tblocks\tfile\tlive\tdead\tsegments")
	row := func(st instanceStats) {
		lv, dd := "-", "-"
		if st.LiveBytes != nil {
			lv, dd = cliutil.HumanBytes(*st.LiveBytes), cliutil.HumanBytes(*st.DeadBytes)
		}
		state := st.State
		if st.Error != "" {
			state += " (" + st.Error + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\n", st.Name, state, st.Blocks, cliutil.HumanBytes(st.FileBytes), lv, dd, st.Segments)
	}
	for _, st := range r.Instances {
		row(st)
	}
	row(r.Total)
	_ = tw.Flush()
	if states[instanceRunning] > 0 {
		fmt.Fprintln(stdout, "\nrunning: a process holds the store; its numbers are the segments it published (not its active segment), its live/dead split is unknown offline")
	}
	return nil
}

// statInstance reads one instance store.
func statInstance(dir string, backends []string) instanceStats {
	st := instanceStats{Dir: dir}
	if !isStoreDir(dir) {
		st.State = instanceNoStore
		return st
	}
	h, err := verify.Open(dir, nil)
	if errors.Is(err, engine.ErrLocked) {
		st.State = instanceRunning
		if err := publishedStats(dir, backends, &st); err != nil {
			st.Error = err.Error()
		}
		return st
	}
	st.State = instanceStopped
	if err != nil {
		st.Error = err.Error()
		return st
	}
	defer func() { _ = h.Close() }()
	es := h.Engine.Stats()
	dead := es.FileBytes - es.LiveBytes
	st.Blocks, st.FileBytes, st.Segments = es.Blocks, es.FileBytes, es.Segments
	st.LiveBytes, st.DeadBytes = &es.LiveBytes, &dead
	return st
}

// publishedStats sums the segments a running instance published under every backend: its
// newest manifest in <backend>/instances/<its instance id>.
func publishedStats(dir string, backends []string, st *instanceStats) error {
	raw, err := os.ReadFile(filepath.Join(dir, engine.InstanceFile))
	if err != nil {
		return fmt.Errorf("instance id: %w", err)
	}
	id, ok := tiers.ParseNamespace(strings.TrimSpace(string(raw)))
	if !ok {
		return fmt.Errorf("instance id in %s: %q is not 32 hex digits", filepath.Join(dir, engine.InstanceFile), strings.TrimSpace(string(raw)))
	}
	for _, b := range backends {
		m, err := tiers.ReadManifest(vfs.Default, tiers.NamespaceDir(b, id), id)
		if errors.Is(err, tiers.ErrNoManifest) {
			continue
		}
		if err != nil {
			return err
		}
		for _, s := range m.Segments {
			st.Blocks += int64(s.Records)
			st.FileBytes += s.Size
			st.Segments++
		}
	}
	return nil
}
