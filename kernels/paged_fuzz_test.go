package kernels

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// FuzzRegister feeds arbitrary registrations to Register: it must never panic, must refuse
// with ErrInvalid or ErrOutOfRange, and whatever it accepts must gather and scatter exactly
// as the element-by-element reference does.
func FuzzRegister(f *testing.F) {
	add := func(layout, dt uint8, nb, bs, h, d int32, tpSize, tpRank int8, offset int32, slack int32, strides []int64) {
		var b []byte
		for _, s := range strides {
			b = binary.LittleEndian.AppendUint64(b, uint64(s))
		}
		f.Add(layout, dt, nb, bs, h, d, tpSize, tpRank, offset, slack, b)
	}
	add(1, 1, 4, 4, 2, 8, 0, 0, 0, 0, nil)
	add(2, 2, 3, 2, 4, 4, 2, 1, 8, 3, nil)
	add(3, 3, 5, 4, 1, 12, 0, 0, 1, 0, nil)
	add(4, 4, 2, 2, 4, 2, 4, 3, 0, 0, nil)
	add(1, 5, 3, 2, 2, 4, 0, 0, 0, 0, []int64{96, 32, 4, 16, 1})     // HND
	add(1, 1, 3, 2, 2, 4, 0, 0, 0, 0, []int64{96, 32, 16, 4, 1})     // contiguous, explicit
	add(1, 1, 3, 2, 2, 4, 0, 0, 0, -1, []int64{96, 32, 16, 2, 1})    // overlapping heads
	add(2, 1, 3, 2, 2, 4, 2, 0, 0, 0, []int64{40, 20, 10, 5, 1})     // padded
	add(3, 2, 3, 2, 1, 6, 0, 0, 0, 0, []int64{20, 7, 1})             // MLA padded
	add(1, 1, 1, 1, 1, 1, 0, 0, 0, 0, []int64{0, -5, 0, 0, 0})       // size-1 dims, any stride
	add(9, 0, -1, 0, 0, 0, -3, 7, -1, 0, []int64{1 << 62, -1 << 62}) // nonsense
	f.Fuzz(func(t *testing.T, layout, dt uint8, nb, bs, h, d int32, tpSize, tpRank int8, offset, slack int32, rawStrides []byte) {
		spec := CacheSpec{Layout: KVLayout(layout % 6), DType: DType(dt % 7), NumBlocks: int(nb), BlockSize: int(bs), KVHeads: int(h), HeadDim: int(d),
			TP: TPSlice{Size: int(tpSize), Rank: int(tpRank)}}
		if len(rawStrides) >= 8 {
			for i := 0; i+8 <= len(rawStrides) && i < 8*6; i += 8 {
				spec.Strides = append(spec.Strides, int64(binary.LittleEndian.Uint64(rawStrides[i:])))
			}
		}
		size, err := spec.RegionBytes()
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("RegionBytes: %v", err)
			}
			return
		}
		// Keep executions small: only modest tensors are allocated.
		off := int64(offset) % 64
		alloc := size + off + int64(slack)%8
		if size > 1<<18 || alloc < 1 {
			return
		}
		dev, err := NewSimDevice(SimOptions{CopyThreads: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Close()
		m, err := dev.Alloc("fuzz", alloc)
		if err != nil {
			t.Fatal(err)
		}
		copy(memBytes(m), testRandomBytes(int(alloc), uint64(size)))
		p, err := Register(spec, []LayerRegion{{Mem: m, Offset: off}})
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("Register: %v", err)
			}
			if off >= 0 && alloc-off >= size {
				t.Fatalf("Register refused a region that fits: %v", err)
			}
			return
		}
		if off < 0 || alloc-off < size {
			t.Fatalf("Register accepted a region of %d bytes at %d for a %d-byte tensor", alloc, off, size)
		}
		ref := newRefView(p.Spec(), []int64{off})
		if p.Record().ShardBytes != ref.shard {
			t.Fatalf("shard %d, reference %d", p.Record().ShardBytes, ref.shard)
		}
		s, err := dev.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		blocks := []int{spec.NumBlocks - 1, 0, spec.NumBlocks / 2}
		if spec.NumBlocks < 3 {
			blocks = blocks[:1]
		}
		mem := memBytes(m)
		want := ref.refGather([][]byte{mem}, blocks)
		got := make([]byte, len(want))
		if err := p.GatherBlocks(s, blocks, got); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("gather of %v differs from the reference", blocks)
		}
		// Scatter new records into the same blocks: the memory must equal the reference's.
		recs := testRandomBytes(len(want), uint64(size)+1)
		expect := append([]byte(nil), mem...)
		ref.refScatter([][]byte{expect}, blocks, recs)
		if err := p.ScatterBlocks(s, blocks, recs); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mem, expect) {
			t.Fatal("scatter differs from the reference")
		}
	})
}
