package cliutil

import (
	"fmt"
	"math"
	"strconv"
)

// FormatSize renders n with the largest binary unit that divides it exactly ("2MiB",
// "12288" becomes "12KiB"), else as plain bytes.
func FormatSize(n int64) string {
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

// HumanBytes renders n approximately for reports ("1.50 GiB"); exact values are printed next
// to it where they matter.
func HumanBytes(n int64) string {
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
