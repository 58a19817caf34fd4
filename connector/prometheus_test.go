package connector

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ucm-go/ucm/engine"
)

// prometheusModel is the model_name the dashboards' $model_name is set to.
const prometheusModel = "prom-model"

// TestPrometheusDashboards runs a real Prometheus (Debian's prometheus package) against the
// metrics endpoints of a worker store and a device-less store of this process, while a workload
// moves their counters, and evaluates through Prometheus's HTTP API every PromQL expression and
// template query of docs/grafana-ucmgo.json, the series UCM's own dashboard charts
// (testdata/ucm-dashboard-series.txt) and, when UCM_GRAFANA_JSON names UCM's
// examples/metrics/grafana.json, that file's queries as written: each must return at least one
// series, and every series must carry the labels the panel's legend shows.
//
// Without a prometheus binary on PATH the test is skipped, loudly; `make test-prometheus`
// (part of `make test`) runs it, after `make deps` installed the package.
func TestPrometheusDashboards(t *testing.T) {
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		msg := "\n" + strings.Repeat("!", 78) + "\n!!! SKIPPED: no `prometheus` binary on PATH (Debian: apt-get install prometheus).\n" +
			"!!! The dashboards' PromQL expressions were NOT evaluated against a real Prometheus.\n" + strings.Repeat("!", 78)
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	dir := t.TempDir()
	port := freePorts(t, 3)
	extra := fmt.Sprintf(`, "metrics_port": %d, "model_name": %q`, port, prometheusModel)
	worker := openStore(t, workerJSON(dir, 0, extra))
	sched := openStore(t, workerJSON(dir, -1, extra))
	var targets []string
	for _, s := range []*Store{worker, sched} {
		addr, err := s.MetricsAddr()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(targets, addr) {
			targets = append(targets, addr)
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		promWorkload(ctx, worker, sched)
	}()
	t.Cleanup(func() { stop(); wg.Wait() })

	api := startPrometheus(t, bin, targets, port+2)
	// Wait until Prometheus has scraped both endpoints a few times (a deadline, not a timing
	// assertion: the check is what the queries return).
	waitQuery(t, api, `min(count_over_time(up{job="ucm"}[1m])) >= 5`)
	if up := query(t, api, `up{job="ucm"} == 1`); len(up) != len(targets) {
		t.Fatalf("targets up: %v, want %v", up, targets)
	}

	vars := map[string]string{"model_name": prometheusModel, "store": ".*", "__rate_interval": "30s"}
	checkDashboard(t, api, "../docs/grafana-ucmgo.json", vars)
	facts := readSeriesFacts(t, "testdata/ucm-dashboard-series.txt")
	for _, f := range facts {
		if f.name == "label_values" {
			checkLabelValues(t, api, "", f.labels[0])
			continue
		}
		res := query(t, api, fmt.Sprintf("%s{model_name=%q}", f.name, prometheusModel))
		if len(res) == 0 {
			t.Errorf("UCM's dashboard series %s{model_name=%q}: no series", f.name, prometheusModel)
		}
		for _, r := range res {
			for _, l := range f.labels {
				if _, ok := r.Metric[l]; !ok {
					t.Errorf("UCM's dashboard series %s: a series without label %s: %v", f.name, l, r.Metric)
				}
			}
		}
	}
	if path := os.Getenv("UCM_GRAFANA_JSON"); path != "" {
		exprs := checkDashboard(t, api, path, vars)
		checkFactsCover(t, facts, exprs)
	} else {
		t.Log("UCM_GRAFANA_JSON not set: UCM's dashboard checked through testdata/ucm-dashboard-series.txt only")
	}
}

// promWorkload dumps, loads (hits and misses) and looks up until ctx is done, so that every
// counter and histogram the dashboards chart moves between scrapes.
func promWorkload(ctx context.Context, worker, sched *Store) {
	cfg := worker.Config()
	for ctx.Err() == nil {
		ids := randomIDs(4)
		for sh := 0; sh < cfg.Layout.Shards; sh++ {
			spans, _ := shardSpans(cfg, ids, sh, true)
			if task, err := worker.Dump(ids, repeat(sh, len(ids)), spans); err == nil {
				_ = worker.Wait(task, nil)
			}
		}
		probe := append(append([]engine.BlockID(nil), ids...), randomIDs(1)...)
		_, _ = worker.Lookup(probe)
		_, _ = sched.Lookup(probe)
		_, _ = sched.LookupOnPrefix(probe)
		spans, _ := shardSpans(cfg, probe, 0, false)
		if task, err := worker.Load(probe, repeat(0, len(probe)), spans); err == nil {
			_ = worker.Wait(task, make([]bool, len(probe))) // the last block misses
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// startPrometheus starts Prometheus scraping targets every second with its API on apiPort,
// waits until it is ready and returns its base URL; it is stopped when the test ends.
func startPrometheus(t *testing.T, bin string, targets []string, apiPort int) string {
	t.Helper()
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, a := range targets {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: ucm\n    static_configs:\n      - targets: [%s]\n",
		strings.Join(quoted, ", "))
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "prometheus.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", apiPort)
	cmd := exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+listen, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})
	base := "http://" + listen
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case err := <-exited:
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited: %v\n%s", err, b)
		default:
		}
		if resp, err := http.Get(base + "/-/ready"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("prometheus not ready after 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promSeries is one series of an instant query's result.
type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

// apiGet calls a Prometheus API path and decodes its data field into out.
func apiGet(t *testing.T, api, path string, params url.Values, out any) error {
	t.Helper()
	resp, err := http.Get(api + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status    string          `json:"status"`
		Data      json.RawMessage `json:"data"`
		ErrorType string          `json:"errorType"`
		Error     string          `json:"error"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("%s: %s: %v", path, body, err)
	}
	if r.Status != "success" {
		return fmt.Errorf("%s %v: %s: %s", path, params, r.ErrorType, r.Error)
	}
	return json.Unmarshal(r.Data, out)
}

// query evaluates expr now and returns its series (a failed query fails the test).
func query(t *testing.T, api, expr string) []promSeries {
	t.Helper()
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSeries `json:"result"`
	}
	if err := apiGet(t, api, "/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		t.Errorf("query %s: %v", expr, err)
		return nil
	}
	if data.ResultType != "vector" {
		t.Errorf("query %s: result type %s, want vector", expr, data.ResultType)
	}
	return data.Result
}

// waitQuery waits until expr returns a series.
func waitQuery(t *testing.T, api, expr string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		var data struct {
			Result []promSeries `json:"result"`
		}
		err := apiGet(t, api, "/api/v1/query", url.Values{"query": {expr}}, &data)
		if err == nil && len(data.Result) > 0 {
			return
		}
		if time.Now().After(deadline) {
			var up struct {
				Result []promSeries `json:"result"`
			}
			_ = apiGet(t, api, "/api/v1/query", url.Values{"query": {"up"}}, &up)
			t.Fatalf("%s still empty after 90 s (%v); up: %v", expr, err, up.Result)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// checkLabelValues asserts that label has values (on series matching match, when given), and
// that model_name's include the test's model.
func checkLabelValues(t *testing.T, api, match, label string) {
	t.Helper()
	params := url.Values{}
	if match != "" {
		params.Set("match[]", match)
	}
	var vals []string
	if err := apiGet(t, api, "/api/v1/label/"+url.PathEscape(label)+"/values", params, &vals); err != nil {
		t.Errorf("label_values(%s, %s): %v", match, label, err)
		return
	}
	if len(vals) == 0 || (label == "model_name" && !slices.Contains(vals, prometheusModel)) {
		t.Errorf("label_values(%s, %s) = %v", match, label, vals)
	}
}

// dashboardTarget is one query of a Grafana dashboard and its legend.
type dashboardTarget struct {
	panel, expr, legend string
}

var (
	grafanaVar      = regexp.MustCompile(`\$\{?(\w+)\}?`)
	legendLabel     = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)
	labelValuesCall = regexp.MustCompile(`^label_values\(\s*(?:([^,()]+?)\s*,\s*)?(\w+)\s*\)$`)
)

// checkDashboard evaluates every target expression and template query of a Grafana dashboard
// with vars substituted, and returns the expressions as evaluated.
func checkDashboard(t *testing.T, api, path string, vars map[string]string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var dash struct {
		Panels     []json.RawMessage `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("dashboard %s: %v", path, err)
	}
	var targets []dashboardTarget
	var walk func([]json.RawMessage)
	walk = func(panels []json.RawMessage) {
		for _, raw := range panels {
			var p struct {
				Title   string            `json:"title"`
				Panels  []json.RawMessage `json:"panels"`
				Targets []struct {
					Expr         string `json:"expr"`
					LegendFormat string `json:"legendFormat"`
				} `json:"targets"`
			}
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("dashboard %s: panel: %v", path, err)
			}
			walk(p.Panels)
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) != "" {
					targets = append(targets, dashboardTarget{p.Title, tg.Expr, tg.LegendFormat})
				}
			}
		}
	}
	walk(dash.Panels)
	if len(targets) == 0 {
		t.Fatalf("dashboard %s: no queries", path)
	}
	subst := func(s string) string {
		return grafanaVar.ReplaceAllStringFunc(s, func(m string) string {
			name := grafanaVar.FindStringSubmatch(m)[1]
			v, ok := vars[name]
			if !ok {
				t.Errorf("dashboard %s: variable $%s has no test value", path, name)
			}
			return v
		})
	}
	var exprs []string
	for _, tg := range targets {
		expr := subst(tg.expr)
		exprs = append(exprs, expr)
		res := query(t, api, expr)
		if len(res) == 0 {
			t.Errorf("dashboard %s, panel %q: %s returns no series", filepath.Base(path), tg.panel, expr)
		}
		for _, m := range legendLabel.FindAllStringSubmatch(tg.legend, -1) {
			for _, r := range res {
				if _, ok := r.Metric[m[1]]; !ok {
					t.Errorf("dashboard %s, panel %q: legend %q shows %s, missing from series %v of %s", filepath.Base(path), tg.panel, tg.legend, m[1], r.Metric, expr)
				}
			}
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		m := labelValuesCall.FindStringSubmatch(strings.TrimSpace(q))
		if m == nil {
			t.Errorf("dashboard %s: template variable %s: query %q is not label_values(...)", path, v.Name, q)
			continue
		}
		checkLabelValues(t, api, m[1], m[2])
	}
	t.Logf("dashboard %s: %d queries and their template variables return series", filepath.Base(path), len(targets))
	return exprs
}

// seriesFact is a line of testdata/ucm-dashboard-series.txt.
type seriesFact struct {
	name   string
	labels []string
}

func readSeriesFacts(t *testing.T, path string) []seriesFact {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []seriesFact
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if fields[0] == "label_values" && len(fields) != 2 {
			t.Fatalf("%s: %q: want label_values LABEL", path, sc.Text())
		}
		out = append(out, seriesFact{fields[0], fields[1:]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("%s: no series", path)
	}
	return out
}

var selectorRe = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)

// checkFactsCover fails when UCM's dashboard queries a series, or selects on a label, that the
// facts file does not list.
func checkFactsCover(t *testing.T, facts []seriesFact, exprs []string) {
	t.Helper()
	known := map[string][]string{}
	for _, f := range facts {
		known[f.name] = f.labels
	}
	for _, e := range exprs {
		for _, m := range selectorRe.FindAllStringSubmatch(e, -1) {
			labels, ok := known[m[1]]
			if !ok {
				t.Errorf("UCM's dashboard queries %s, which testdata/ucm-dashboard-series.txt does not list", m[1])
				continue
			}
			for _, sel := range strings.Split(m[2], ",") {
				parts := strings.FieldsFunc(sel, func(r rune) bool { return r == '=' || r == '!' || r == '~' })
				if len(parts) == 0 {
					continue
				}
				if l := strings.TrimSpace(parts[0]); l != "" && !slices.Contains(labels, l) {
					t.Errorf("UCM's dashboard selects %s on %s, which testdata/ucm-dashboard-series.txt does not list", m[1], l)
				}
			}
		}
	}
}
