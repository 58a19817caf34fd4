package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes parseSize accepts, all binary (powers of 1024).
var sizeUnits = []struct {
	suffixes []string
	mult     int64
}{
	{[]string{"gib", "g"}, 1 << 30},
	{[]string{"mib", "m"}, 1 << 20},
	{[]string{"kib", "k"}, 1 << 10},
	{[]string{"b", ""}, 1},
}

// parseSize parses a byte count: plain digits, or digits followed by K/KiB, M/MiB or G/GiB
// (binary units, case-insensitive, e.g. "2MiB" = 2097152). Decimal units such as "MB",
// fractions, signs and values over 2^63-1 are rejected.
func parseSize(s string) (int64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	for _, u := range sizeUnits {
		for _, suf := range u.suffixes {
			num, ok := strings.CutSuffix(t, suf)
			if !ok || num == "" {
				continue
			}
			if num[0] < '0' || num[0] > '9' {
				continue // not digits: try another suffix, else fail below
			}
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil {
				if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
					return 0, fmt.Errorf("size %q: too large", s)
				}
				break
			}
			if n > math.MaxInt64/u.mult {
				return 0, fmt.Errorf("size %q: too large", s)
			}
			return n * u.mult, nil
		}
	}
	return 0, fmt.Errorf("size %q: want a byte count such as 4096, 256KiB, 2MiB or 1GiB (K, M, G are binary units)", s)
}

// formatSize renders n with the largest binary unit that divides it exactly ("2MiB",
// "12288" becomes "12KiB"), else as plain bytes.
func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// humanBytes renders n approximately for reports ("1.50 GiB"); exact values are printed next
// to it where they matter.
func humanBytes(n int64) string {
	f := float64(n)
	for _, u := range []struct {
		name string
		mult float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if math.Abs(f) >= u.mult {
			return fmt.Sprintf("%.2f %s", f/u.mult, u.name)
		}
	}
	return fmt.Sprintf("%d B", n)
}
