package verify

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/ucm-go/ucm/format"
	"github.com/ucm-go/ucm/index"
)

const (
	batchSeg = 7
	batchGen = 0x5eed
)

var batchLayout = format.Layout{Shards: 3, TensorsPerShard: 2, ShardBytes: 4096}

// batchRecord encodes a batch record of the blocks ids (first sequence number seq) with the
// format's encoders: header, layer-major runs, and the commit block unless committed is false
// (an abandoned batch: zeros there). shard(b, i) is the content of shard i of block b.
func batchRecord(t *testing.T, ids []format.BlockID, seq uint64, committed bool) ([]byte, uint32) {
	t.Helper()
	h := format.BatchHeader{Segment: batchSeg, Generation: batchGen, FirstSeq: seq, Layout: batchLayout, IDs: ids}
	rec := make([]byte, h.ExtentBytes())
	n := len(ids)
	crc, err := format.EncodeBatchHeader(rec[:format.BatchHeaderSize(n)], &h)
	if err != nil {
		t.Fatal(err)
	}
	c := format.BatchCommit{Segment: batchSeg, Generation: batchGen, FirstSeq: seq, Blocks: n, Shards: batchLayout.Shards, HeaderCRC: crc,
		ShardCRCs: make([]uint32, n*batchLayout.Shards)}
	for i := 0; i < batchLayout.Shards; i++ {
		for b := 0; b < n; b++ {
			s := rec[h.ShardOffset(b, i):][:batchLayout.ShardBytes]
			for k := range s {
				s[k] = byte(int(ids[b][0]) + i*31 + k)
			}
			c.ShardCRCs[i*n+b] = format.Checksum(s)
		}
	}
	if committed {
		if err := format.EncodeBatchCommit(rec[h.CommitOffset():], &c); err != nil {
			t.Fatal(err)
		}
	}
	return rec, crc
}

func bid(n byte) format.BlockID { return format.BlockID{n, 0xb, 0xa, 0x7} }

// batchSegment writes a segment file holding a committed batch, then an abandoned one, then
// another committed one; sealed adds the footer, which lists the committed two.
func batchSegment(t *testing.T, fs vfs.FS, path string, sealed bool) (size int64, offs []int64) {
	t.Helper()
	hdr := make([]byte, format.SegmentHeaderSize)
	if err := format.EncodeSegmentHeader(hdr, &format.SegmentHeader{Number: batchSeg, Generation: batchGen, Features: format.KnownFeatures}); err != nil {
		t.Fatal(err)
	}
	file := hdr
	var entries []format.FooterEntry
	for k, committed := range []bool{true, false, true} {
		ids := []format.BlockID{bid(byte(10*k + 1)), bid(byte(10*k + 2)), bid(byte(10*k + 3))}
		rec, crc := batchRecord(t, ids, uint64(100*k), committed)
		offs = append(offs, int64(len(file)))
		if committed {
			entries = append(entries, format.FooterEntry{ID: ids[0], Offset: int64(len(file)), Length: int64(len(rec)), Seq: uint64(100 * k), HeaderCRC: crc, Type: format.RecordBatch})
		}
		file = append(file, rec...)
	}
	if sealed {
		footer, err := format.EncodeFooter(batchSeg, batchGen, int64(len(file)), entries)
		if err != nil {
			t.Fatal(err)
		}
		file = append(file, footer...)
	}
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if _, err := f.WriteAt(file, 0); err != nil {
		t.Fatal(err)
	}
	return int64(len(file)), offs
}

// TestReadBatchSegment: verify's segment reader checks batch records (header, commit block,
// every shard) through the footer and by a walk, lists their blocks, and passes over an
// abandoned batch as dead bytes, not a problem; a flipped shard byte is an invalid record
// naming the block and the shard.
func TestReadBatchSegment(t *testing.T) {
	fs := vfs.NewMem()
	for _, sealed := range []bool{true, false} {
		size, offs := batchSegment(t, fs, "/seg", sealed)
		mode, recorded := modeSealed, size
		if !sealed {
			mode, recorded = modeUnsealed, 0
		}
		res, err := readSegment(fs, "/seg", batchSeg, batchGen, recorded, mode, true, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Problems) != 0 || res.Stop != nil || res.Footer != sealed || len(res.Records) != 3 {
			t.Fatalf("sealed %v: problems %v, stop %v, footer %v, %d records", sealed, res.Problems, res.Stop, res.Footer, len(res.Records))
		}
		for k, ri := range res.Records {
			if ri.Offset != offs[k] {
				t.Fatalf("record %d at %d, want %d", k, ri.Offset, offs[k])
			}
			if k == 1 {
				if !ri.Dead || ri.Err == nil || ri.Blocks != nil {
					t.Fatalf("abandoned batch: %+v", ri)
				}
				continue
			}
			if ri.Err != nil || !ri.PayloadChecked || ri.Dead || len(ri.Blocks) != 3 {
				t.Fatalf("committed batch %d: %+v", k, ri)
			}
			for b, bb := range ri.Blocks {
				if bb.ID != bid(byte(10*k+b+1)) || bb.Seq != uint64(100*k+b) || len(bb.ShardCRCs) != batchLayout.Shards {
					t.Fatalf("batch %d block %d: %+v", k, b, bb)
				}
			}
		}
		if sealed {
			want := slices.Clone(res.Records[2].Blocks[1].ShardCRCs)
			// Flip a byte of shard 2 of block 1 of the last batch.
			f, err := fs.OpenReadWrite("/seg", vfs.WriteCategoryUnspecified)
			if err != nil {
				t.Fatal(err)
			}
			h := format.BatchHeader{Layout: batchLayout, IDs: make([]format.BlockID, 3)}
			at := offs[2] + h.ShardOffset(1, 2) + 9
			if _, err := f.WriteAt([]byte{0xee}, at); err != nil {
				t.Fatal(err)
			}
			_ = f.Close()
			res, err := readSegment(fs, "/seg", batchSeg, batchGen, size, modeSealed, true, nil)
			if err != nil {
				t.Fatal(err)
			}
			ri := res.Records[2]
			if !errors.Is(ri.Err, format.ErrCorrupt) || ri.Dead || !strings.Contains(ri.Err.Error(), bid(22).String()) || !strings.Contains(ri.Err.Error(), "shard 2 checksum") {
				t.Fatalf("flipped shard byte: %v", ri.Err)
			}
			if !slices.Equal(ri.Blocks[1].ShardCRCs, want) {
				t.Fatal("the commit block's checksums changed")
			}
		}
	}
}

// TestBatchMismatch: an index entry of a batch block agrees with the block at its position of
// the batch record, and each disagreement is named.
func TestBatchMismatch(t *testing.T) {
	ri := RecordInfo{HeaderCRC: 0xabc, Blocks: []BatchBlock{{ID: bid(1), Seq: 5, ShardCRCs: []uint32{1, 2, 3}}, {ID: bid(2), Seq: 6, ShardCRCs: []uint32{4, 5, 6}}}}
	loc := index.Location{Segment: batchSeg, Offset: 4096, Layout: batchLayout, Seq: 6, HeaderCRC: 0xabc, ShardCRCs: []uint32{4, 5, 6}, BatchBlocks: 2, BatchPos: 1}
	if why := batchMismatch(ri, bid(2), 0, loc, batchLayout); len(why) != 0 {
		t.Fatalf("matching entry: %v", why)
	}
	other := loc
	other.BatchPos, other.Seq = 0, 5 // block 0's place, block 1's id and checksums
	why := batchMismatch(ri, bid(2), 0, other, batchLayout)
	if len(why) != 2 || !strings.Contains(why[0], "holds block "+bid(1).String()) || !strings.Contains(why[1], "shard checksums") {
		t.Fatalf("entry at the wrong position: %v", why)
	}
	other = loc
	other.HeaderCRC, other.Seq = 1, 7
	if why := batchMismatch(ri, bid(2), 0, other, batchLayout); len(why) != 2 {
		t.Fatalf("header crc and seq: %v", why)
	}
}
