package format

import (
	"bytes"
	"encoding/binary"
)

// Lease of a shared path's reclaimer: the one instance that enforces the shared tier's global
// capacity holds it (docs/sharing.md). The holder rewrites it (temporary file, sync, rename)
// before it expires; another instance takes it over once it has expired.
//
//	offset size field
//	     0    8 magic "UCMGOLSE"
//	     8    4 lease version (uint32 LE, = LeaseVersion)
//	    12    4 zero
//	    16   16 holder instance id
//	    32    8 expiry, Unix nanoseconds (int64 LE)
//	    40    8 term (uint64 LE): +1 at every change of holder
//	    48   12 zero
//	    60    4 CRC32C of bytes [0, 60) (uint32 LE)
//
// Part of the on-disk format: do not change without bumping LeaseVersion.
const (
	LeaseSize    = 64
	LeaseVersion = 1

	leaseMagic     = "UCMGOLSE"
	leaseOffVer    = 8
	leaseOffHolder = 16
	leaseOffExpiry = 32
	leaseOffTerm   = 40
	leaseOffCRC    = 60
)

// Lease is a decoded lease file.
type Lease struct {
	Holder InstanceID
	Expiry int64 // Unix nanoseconds
	Term   uint64
}

// EncodeLease returns the LeaseSize bytes of l.
func EncodeLease(l Lease) []byte {
	buf := make([]byte, LeaseSize)
	le := binary.LittleEndian
	copy(buf, leaseMagic)
	le.PutUint32(buf[leaseOffVer:], LeaseVersion)
	copy(buf[leaseOffHolder:], l.Holder[:])
	le.PutUint64(buf[leaseOffExpiry:], uint64(l.Expiry))
	le.PutUint64(buf[leaseOffTerm:], l.Term)
	le.PutUint32(buf[leaseOffCRC:], Checksum(buf[:leaseOffCRC]))
	return buf
}

// DecodeLease checks and decodes a lease file: exactly LeaseSize bytes, magic, checksum,
// version, zero reserved bytes and a holder. Errors wrap ErrCorrupt.
func DecodeLease(src []byte) (Lease, error) {
	var l Lease
	if len(src) != LeaseSize {
		return l, errorf(ErrCorrupt, "lease: %d bytes, want %d", len(src), LeaseSize)
	}
	if !bytes.Equal(src[:len(leaseMagic)], []byte(leaseMagic)) {
		return l, errorf(ErrCorrupt, "lease: field magic: %q is not %q", src[:len(leaseMagic)], leaseMagic)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(src[leaseOffCRC:]), Checksum(src[:leaseOffCRC]); got != want {
		return l, errorf(ErrCorrupt, "lease: field crc: stored %#08x, computed %#08x", got, want)
	}
	if v := le.Uint32(src[leaseOffVer:]); v != LeaseVersion {
		return l, errorf(ErrCorrupt, "lease: field version: %d, this build reads %d", v, LeaseVersion)
	}
	if !IsZeroBlock(src[12:leaseOffHolder]) || !IsZeroBlock(src[48:leaseOffCRC]) {
		return l, errorf(ErrCorrupt, "lease: reserved bytes not zero")
	}
	copy(l.Holder[:], src[leaseOffHolder:])
	if l.Holder == (InstanceID{}) {
		return l, errorf(ErrCorrupt, "lease: field holder: zero instance id")
	}
	l.Expiry = int64(le.Uint64(src[leaseOffExpiry:]))
	l.Term = le.Uint64(src[leaseOffTerm:])
	return l, nil
}
