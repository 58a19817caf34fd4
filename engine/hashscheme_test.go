package engine

import (
	"errors"
	"testing"

	"github.com/ucm-go/ucm/format"
)

// TestHashSchemeNames: the scheme names a store's SCHEMA file records parse back, unknown names
// are ErrInvalid, and the zero value is UCM-Go's scheme.
func TestHashSchemeNames(t *testing.T) {
	for _, s := range []string{"", "UCMGO", "md5", "ucm_pickle"} {
		if _, err := ParseHashScheme(s); !errors.Is(err, format.ErrInvalid) {
			t.Errorf("ParseHashScheme(%q): err %v, want ErrInvalid", s, err)
		}
	}
	for _, s := range []HashScheme{HashSchemeUCMGo, HashSchemeUCMPickle} {
		got, err := ParseHashScheme(s.String())
		if err != nil || got != s {
			t.Errorf("ParseHashScheme(%q) = %v, %v", s.String(), got, err)
		}
	}
	if HashSchemeUCMGo.String() != "ucmgo" || HashSchemeUCMPickle.String() != "ucm-pickle" {
		t.Errorf("names %q %q", HashSchemeUCMGo, HashSchemeUCMPickle)
	}
	var zero HashScheme
	if zero != HashSchemeUCMGo {
		t.Error("zero HashScheme is not HashSchemeUCMGo")
	}
}
