// Package reuse holds helpers for reusable scratch memory shared by the kernels and the
// sparse methods.
package reuse

// Grow returns s resized to n elements, all zero, reusing its array when it is large enough.
func Grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
