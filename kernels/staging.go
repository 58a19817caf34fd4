package kernels

import (
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// StagingAlign is the alignment of every staging buffer's start and length: O_DIRECT reads and
// writes can use it directly.
const StagingAlign = 4096

// MaxStagingBytes bounds one staging buffer (64 GiB); larger sizes are refused before mapping.
const MaxStagingBytes = 64 << 30

// hugePageBytes is the transparent huge page size buffers are aligned to with HugePages.
const hugePageBytes = 2 << 20

// StagingOptions says where and how a staging buffer is allocated. The zero value is a plain
// aligned buffer with no placement, huge pages or locking.
type StagingOptions struct {
	// Place asks for the buffer's pages on NUMANode (the node of the GPU it feeds, from
	// Discover's GPUInfo.NUMANode). Placement is best effort (MPOL_PREFERRED: the kernel falls
	// back to other nodes when that one is full); Placement reports what happened.
	Place    bool
	NUMANode int
	// HugePages aligns the mapping to 2 MiB and advises transparent huge pages
	// (MADV_HUGEPAGE), which cuts TLB misses on large gathers; best effort.
	HugePages bool
	// Lock page-locks the buffer (mlock), the host half of what CUDA calls pinned memory: its
	// pages stay resident, so a DMA engine can read them. On a real GPU the buffer would also be
	// registered with cudaHostRegister so the driver DMAs from it directly; the simulated device
	// needs only the lock, so "pinned" is modelled as locked. Best effort (RLIMIT_MEMLOCK).
	Lock bool
}

// Placement reports what a staging buffer got of what StagingOptions asked for.
type Placement struct {
	// RequestedNode is the NUMA node asked for, or -1 when none was.
	RequestedNode int `json:"requested_node"`
	// Node is the node the buffer's first page lives on, or -1 when unknown.
	Node int `json:"node"`
	// Placed is true when a placement was asked for, the policy was applied and the pages
	// landed on the requested node.
	Placed bool `json:"placed"`
	// HugePages is true when MADV_HUGEPAGE was applied.
	HugePages bool `json:"huge_pages"`
	// Pinned is true when the buffer is page-locked (see StagingOptions.Lock).
	Pinned bool `json:"pinned"`
	// Notes says why a requested property was not obtained, empty when everything was.
	Notes []string `json:"notes,omitempty"`
}

// Staging is a host buffer that device copies stage through: anonymous mmap'd memory, aligned
// to StagingAlign, outside the Go heap (so it never moves and the collector never scans it).
// Stream operations that use its bytes keep it mapped until they finish, so Close never
// invalidates memory a queued copy still reads or writes; Bytes must not be used after Close.
type Staging struct {
	buf       []byte // the usable bytes
	base      unsafe.Pointer
	mapped    uintptr // length of the whole mapping at base
	placement Placement

	// guarded by stagingMu
	refs   int
	closed bool
}

// stagingMu guards the registry of live staging buffers and their reference counts.
var (
	stagingMu   sync.Mutex
	stagingLive []*Staging // sorted by start address
)

// NewStaging maps a staging buffer of size bytes (rounded up to StagingAlign) with the
// requested placement, zeroed and prefaulted. Sizes outside [1, MaxStagingBytes] are refused
// with ErrInvalid; a failed mmap is returned; failed best-effort requests (placement, huge
// pages, locking) are reported by Placement, not as errors.
func NewStaging(size int64, opts StagingOptions) (*Staging, error) {
	if size < 1 || size > MaxStagingBytes {
		return nil, errorf(ErrInvalid, "staging: size %d outside [1, %d]", size, int64(MaxStagingBytes))
	}
	if opts.Place && (opts.NUMANode < 0 || opts.NUMANode >= maxNUMANodes) {
		return nil, errorf(ErrInvalid, "staging: NUMA node %d outside [0, %d)", opts.NUMANode, maxNUMANodes)
	}
	n := (size + StagingAlign - 1) / StagingAlign * StagingAlign
	align := int64(StagingAlign)
	if opts.HugePages {
		align = hugePageBytes
	}
	mapLen := n
	if align > StagingAlign {
		mapLen += align
	}
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(mapLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("staging: mmap %d bytes: %w", mapLen, err)
	}
	// Trim the mapping to an aligned start (huge pages), keeping exactly n bytes.
	if skip := int64(uintptr(p) % uintptr(align)); align > StagingAlign {
		if skip != 0 {
			skip = align - skip
			_ = unix.MunmapPtr(p, uintptr(skip))
			p = unsafe.Add(p, skip)
		}
		if tail := mapLen - skip - n; tail > 0 {
			_ = unix.MunmapPtr(unsafe.Add(p, n), uintptr(tail))
		}
		mapLen = n
	}
	s := &Staging{buf: unsafe.Slice((*byte)(p), n), base: p, mapped: uintptr(mapLen)}
	s.placement = Placement{RequestedNode: -1, Node: -1}
	if opts.Place {
		s.placement.RequestedNode = opts.NUMANode
	}
	if opts.HugePages {
		if err := adviseHugePages(s.buf); err != nil {
			s.note("huge pages: %v", err)
		} else {
			s.placement.HugePages = true
		}
	}
	if opts.Place {
		if err := bindToNode(s.buf, opts.NUMANode); err != nil {
			s.note("NUMA placement on node %d: %v", opts.NUMANode, err)
		}
	}
	// Fault every page in now, under the policy just set, rather than in the first copy.
	for i := 0; i < len(s.buf); i += StagingAlign {
		s.buf[i] = 0
	}
	if opts.Lock {
		if err := unix.Mlock(s.buf); err != nil {
			s.note("page lock: %v", err)
		} else {
			s.placement.Pinned = true
		}
	}
	if node, err := nodeOf(s.buf); err == nil {
		s.placement.Node = node
	}
	if opts.Place {
		if s.placement.Node == opts.NUMANode {
			s.placement.Placed = true
		} else if len(s.placement.Notes) == 0 {
			s.note("NUMA placement: pages on node %d, not %d", s.placement.Node, opts.NUMANode)
		}
	}
	stagingMu.Lock()
	i := sort.Search(len(stagingLive), func(i int) bool { return uintptr(stagingLive[i].base) > uintptr(s.base) })
	stagingLive = append(stagingLive, nil)
	copy(stagingLive[i+1:], stagingLive[i:])
	stagingLive[i] = s
	stagingMu.Unlock()
	return s, nil
}

func (s *Staging) note(format string, args ...any) {
	s.placement.Notes = append(s.placement.Notes, fmt.Sprintf(format, args...))
}

// Bytes is the buffer: Len bytes starting on a StagingAlign boundary. It must not be used
// after Close.
func (s *Staging) Bytes() []byte { return s.buf }

// Len is the buffer's length: the requested size rounded up to StagingAlign.
func (s *Staging) Len() int64 { return int64(len(s.buf)) }

// Placement reports the NUMA node, huge-page and lock state the buffer got.
func (s *Staging) Placement() Placement {
	p := s.placement
	p.Notes = append([]string(nil), p.Notes...)
	return p
}

// Close unmaps the buffer once no queued stream operation uses it any more. Closing twice is a
// no-op.
func (s *Staging) Close() error {
	stagingMu.Lock()
	if s.closed {
		stagingMu.Unlock()
		return nil
	}
	s.closed = true
	for i, t := range stagingLive {
		if t == s {
			stagingLive = append(stagingLive[:i], stagingLive[i+1:]...)
			break
		}
	}
	last := s.refs == 0
	stagingMu.Unlock()
	if last {
		return s.unmap()
	}
	return nil
}

func (s *Staging) unmap() error {
	if err := unix.MunmapPtr(s.base, s.mapped); err != nil {
		return fmt.Errorf("staging: munmap: %w", err)
	}
	return nil
}

// pinHost returns the live staging buffer b lies in, with a reference taken, so an operation
// using b keeps it mapped; nil when b is not staging memory.
func pinHost(b []byte) []*Staging {
	a := addrOf(b)
	if a == 0 {
		return nil
	}
	stagingMu.Lock()
	defer stagingMu.Unlock()
	i := sort.Search(len(stagingLive), func(i int) bool { return uintptr(stagingLive[i].base) > a })
	if i == 0 {
		return nil
	}
	s := stagingLive[i-1]
	if a >= uintptr(s.base)+s.mapped {
		return nil
	}
	s.refs++
	return []*Staging{s}
}

// unpin drops the references pinHost took, unmapping buffers closed meanwhile.
func unpin(ss []*Staging) {
	for _, s := range ss {
		stagingMu.Lock()
		s.refs--
		last := s.closed && s.refs == 0
		stagingMu.Unlock()
		if last {
			_ = s.unmap()
		}
	}
}
