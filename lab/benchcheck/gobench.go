package benchcheck

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// procSuffix is the "-N" GOMAXPROCS suffix go test appends to a benchmark's name.
var procSuffix = regexp.MustCompile(`-\d+$`)

// ParseGoBench reads `go test -bench` output and returns, for every benchmark line that reports
// metric (a custom unit of b.ReportMetric, or ns/op), the benchmark's name without its
// GOMAXPROCS suffix → the metric's values, one per line (one per -count). A line that names
// the metric without a number before it is an error naming the line.
func ParseGoBench(r io.Reader, metric string) (map[string][]float64, error) {
	out := make(map[string][]float64)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		for i := 3; i < len(f); i++ { // name, iterations, then value unit pairs
			if f[i] != metric {
				continue
			}
			v, err := strconv.ParseFloat(f[i-1], 64)
			if err != nil {
				return nil, fmt.Errorf("go test output line %d: %s: metric %s: %w", line, f[0], metric, err)
			}
			name := procSuffix.ReplaceAllString(f[0], "")
			out[name] = append(out[name], v)
		}
	}
	return out, sc.Err()
}

// Median returns the median of vs (the mean of the middle two for an even count; 0 for none)
// without reordering vs.
func Median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
