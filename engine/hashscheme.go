package engine

import (
	"fmt"
	"strconv"

	"github.com/ucm-go/ucm/format"
)

// HashScheme names how a connector turned token ids into block ids. A store records it in its
// Schema (so a store refuses ids of another scheme: ErrSchemaMismatch) and in its SCHEMA file;
// the engine itself never hashes tokens and treats block ids as opaque. connector/ucmhash
// implements both schemes.
type HashScheme int

const (
	// HashSchemeUCMGo is UCM-Go's own scheme and the default (zero value):
	// seed = MD5("UCMHASHSEED" ‖ meta) and id[i] = MD5(id[i-1] ‖ LE32(t0) ‖ LE32(t1) ‖ …) over
	// the tokens of block i, with id[-1] = seed.
	HashSchemeUCMGo HashScheme = iota
	// HashSchemeUCMPickle is bit-compatible with UCM's Python RequestHasher:
	// hasher(x) = MD5(meta ‖ pickle.dumps(x, protocol=5)), seed = hasher("UCM_HASH_SEED") and
	// id[i] = hasher((id[i-1], tuple(tokens of block i))), with id[-1] = seed.
	HashSchemeUCMPickle
)

// String returns the scheme's configuration name: "ucmgo" or "ucm-pickle".
func (s HashScheme) String() string {
	switch s {
	case HashSchemeUCMGo:
		return "ucmgo"
	case HashSchemeUCMPickle:
		return "ucm-pickle"
	default:
		return "HashScheme(" + strconv.Itoa(int(s)) + ")"
	}
}

// ParseHashScheme parses a scheme name as returned by HashScheme.String. The error for an
// unknown name wraps format.ErrInvalid.
func ParseHashScheme(s string) (HashScheme, error) {
	switch s {
	case "ucmgo":
		return HashSchemeUCMGo, nil
	case "ucm-pickle":
		return HashSchemeUCMPickle, nil
	default:
		return 0, fmt.Errorf("hash scheme %q (want \"ucmgo\" or \"ucm-pickle\"): %w", s, format.ErrInvalid)
	}
}
