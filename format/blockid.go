package format

import "encoding/hex"

// BlockIDSize is the size in bytes of a BlockID.
const BlockIDSize = 16

// BlockID is the 16-byte content address of a KV block: the chained MD5 hash of its tokens
// (connector/ucmhash computes it). The engine treats it as opaque bytes.
type BlockID [BlockIDSize]byte

// String returns the ID as 32 lower-case hex digits.
func (id BlockID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether every byte of the ID is zero. The zero ID is never a valid block:
// it is what an uninitialised slot looks like, so the engine rejects it.
func (id BlockID) IsZero() bool { return id == BlockID{} }

// ParseBlockID parses 32 hex digits into a BlockID.
func ParseBlockID(s string) (BlockID, error) {
	var id BlockID
	if len(s) != 2*BlockIDSize {
		return id, errorf(ErrInvalid, "block id %q: want %d hex digits, got %d", s, 2*BlockIDSize, len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return id, errorf(ErrInvalid, "block id %q: %v", s, err)
	}
	return id, nil
}
