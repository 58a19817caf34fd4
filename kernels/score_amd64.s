#include "textflag.h"

// Scoring kernels (score.go). Every kernel walks n runs: run i reads d query float32s from
// q + i·qs·4 and d elements from v + i·vs·(element size), d a positive multiple of 8. Four
// accumulators take 32 elements a step, then one takes the remaining 8 at a time; the lanes
// are summed at the end of the run and the float32 result stored to out[i].

// HSUM(Y0 + Y1 + Y2 + Y3) → X0's low lane.
#define HSUM4 \
	VADDPS       Y1, Y0, Y0 \
	VADDPS       Y3, Y2, Y2 \
	VADDPS       Y2, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS       X1, X0, X0 \
	VHADDPS      X0, X0, X0 \
	VHADDPS      X0, X0, X0

#define ZERO4 \
	VXORPS Y0, Y0, Y0 \
	VXORPS Y1, Y1, Y1 \
	VXORPS Y2, Y2, Y2 \
	VXORPS Y3, Y3, Y3

// func dotsF16AVX2(out, q *float32, v *byte, n, d, qs, vs int)
TEXT ·dotsF16AVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ d+32(FP), R8
	MOVQ qs+40(FP), R9
	MOVQ vs+48(FP), R10
	SHLQ $2, R9
	SHLQ $1, R10

dots_row:
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R8, R13
	ZERO4

dots_32:
	CMPQ        R13, $32
	JLT         dots_8
	VCVTPH2PS   0(R12), Y4
	VCVTPH2PS   16(R12), Y5
	VCVTPH2PS   32(R12), Y6
	VCVTPH2PS   48(R12), Y7
	VFMADD231PS 0(R11), Y4, Y0
	VFMADD231PS 32(R11), Y5, Y1
	VFMADD231PS 64(R11), Y6, Y2
	VFMADD231PS 96(R11), Y7, Y3
	ADDQ        $64, R12
	ADDQ        $128, R11
	SUBQ        $32, R13
	JMP         dots_32

dots_8:
	TESTQ       R13, R13
	JZ          dots_sum
	VCVTPH2PS   0(R12), Y4
	VFMADD231PS 0(R11), Y4, Y0
	ADDQ        $16, R12
	ADDQ        $32, R11
	SUBQ        $8, R13
	JMP         dots_8

dots_sum:
	HSUM4
	VMOVSS X0, 0(DI)
	ADDQ   $4, DI
	ADDQ   R9, SI
	ADDQ   R10, DX
	DECQ   CX
	JNZ    dots_row
	VZEROUPPER
	RET

// func sqDistsF16AVX2(out, q *float32, v *byte, n, d, qs, vs int)
TEXT ·sqDistsF16AVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ d+32(FP), R8
	MOVQ qs+40(FP), R9
	MOVQ vs+48(FP), R10
	SHLQ $2, R9
	SHLQ $1, R10

sq_row:
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R8, R13
	ZERO4

sq_32:
	CMPQ        R13, $32
	JLT         sq_8
	VCVTPH2PS   0(R12), Y4
	VCVTPH2PS   16(R12), Y5
	VCVTPH2PS   32(R12), Y6
	VCVTPH2PS   48(R12), Y7
	VSUBPS      0(R11), Y4, Y4
	VSUBPS      32(R11), Y5, Y5
	VSUBPS      64(R11), Y6, Y6
	VSUBPS      96(R11), Y7, Y7
	VFMADD231PS Y4, Y4, Y0
	VFMADD231PS Y5, Y5, Y1
	VFMADD231PS Y6, Y6, Y2
	VFMADD231PS Y7, Y7, Y3
	ADDQ        $64, R12
	ADDQ        $128, R11
	SUBQ        $32, R13
	JMP         sq_32

sq_8:
	TESTQ       R13, R13
	JZ          sq_sum
	VCVTPH2PS   0(R12), Y4
	VSUBPS      0(R11), Y4, Y4
	VFMADD231PS Y4, Y4, Y0
	ADDQ        $16, R12
	ADDQ        $32, R11
	SUBQ        $8, R13
	JMP         sq_8

sq_sum:
	HSUM4
	VMOVSS X0, 0(DI)
	ADDQ   $4, DI
	ADDQ   R9, SI
	ADDQ   R10, DX
	DECQ   CX
	JNZ    sq_row
	VZEROUPPER
	RET

// func questF16AVX2(out, q *float32, lo, hi *byte, n, d, qs, vs int)
TEXT ·questF16AVX2(SB), NOSPLIT, $0-64
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ lo+16(FP), DX
	MOVQ hi+24(FP), BX
	MOVQ n+32(FP), CX
	MOVQ d+40(FP), R8
	MOVQ qs+48(FP), R9
	MOVQ vs+56(FP), R10
	SHLQ $2, R9
	SHLQ $1, R10

quest_row:
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ BX, R14
	MOVQ R8, R13
	ZERO4

quest_16:
	CMPQ      R13, $16
	JLT       quest_8
	VMOVUPS   0(R11), Y8
	VMOVUPS   32(R11), Y9
	VCVTPH2PS 0(R12), Y4
	VCVTPH2PS 0(R14), Y5
	VCVTPH2PS 16(R12), Y6
	VCVTPH2PS 16(R14), Y7
	VMULPS    Y8, Y4, Y4
	VMULPS    Y8, Y5, Y5
	VMULPS    Y9, Y6, Y6
	VMULPS    Y9, Y7, Y7
	VMAXPS    Y5, Y4, Y4
	VMAXPS    Y7, Y6, Y6
	VADDPS    Y4, Y0, Y0
	VADDPS    Y6, Y1, Y1
	ADDQ      $32, R12
	ADDQ      $32, R14
	ADDQ      $64, R11
	SUBQ      $16, R13
	JMP       quest_16

quest_8:
	TESTQ     R13, R13
	JZ        quest_sum
	VMOVUPS   0(R11), Y8
	VCVTPH2PS 0(R12), Y4
	VCVTPH2PS 0(R14), Y5
	VMULPS    Y8, Y4, Y4
	VMULPS    Y8, Y5, Y5
	VMAXPS    Y5, Y4, Y4
	VADDPS    Y4, Y2, Y2
	ADDQ      $16, R12
	ADDQ      $16, R14
	ADDQ      $32, R11
	SUBQ      $8, R13
	JMP       quest_8

quest_sum:
	HSUM4
	VMOVSS X0, 0(DI)
	ADDQ   $4, DI
	ADDQ   R9, SI
	ADDQ   R10, DX
	ADDQ   R10, BX
	DECQ   CX
	JNZ    quest_row
	VZEROUPPER
	RET

// func dotsInt8AVX2(out, q *float32, v *int8, n, d, qs, vs int)
TEXT ·dotsInt8AVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ d+32(FP), R8
	MOVQ qs+40(FP), R9
	MOVQ vs+48(FP), R10
	SHLQ $2, R9

i8_row:
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R8, R13
	ZERO4

i8_32:
	CMPQ        R13, $32
	JLT         i8_8
	VPMOVSXBD   0(R12), Y4
	VPMOVSXBD   8(R12), Y5
	VPMOVSXBD   16(R12), Y6
	VPMOVSXBD   24(R12), Y7
	VCVTDQ2PS   Y4, Y4
	VCVTDQ2PS   Y5, Y5
	VCVTDQ2PS   Y6, Y6
	VCVTDQ2PS   Y7, Y7
	VFMADD231PS 0(R11), Y4, Y0
	VFMADD231PS 32(R11), Y5, Y1
	VFMADD231PS 64(R11), Y6, Y2
	VFMADD231PS 96(R11), Y7, Y3
	ADDQ        $32, R12
	ADDQ        $128, R11
	SUBQ        $32, R13
	JMP         i8_32

i8_8:
	TESTQ       R13, R13
	JZ          i8_sum
	VPMOVSXBD   0(R12), Y4
	VCVTDQ2PS   Y4, Y4
	VFMADD231PS 0(R11), Y4, Y0
	ADDQ        $8, R12
	ADDQ        $32, R11
	SUBQ        $8, R13
	JMP         i8_8

i8_sum:
	HSUM4
	VMOVSS X0, 0(DI)
	ADDQ   $4, DI
	ADDQ   R9, SI
	ADDQ   R10, DX
	DECQ   CX
	JNZ    i8_row
	VZEROUPPER
	RET

// func hammingRowsAVX512(q, codes *byte, w, rows int) (minDist, total int)
//
// w a positive multiple of 32, rows ≥ 1: per row, XOR with q 32 bytes at a time, VPOPCNTQ
// (AVX-512 VPOPCNTDQ with VL) and add; the row's sum updates the minimum and the total.
TEXT ·hammingRowsAVX512(SB), NOSPLIT, $0-48
	MOVQ q+0(FP), SI
	MOVQ codes+8(FP), DX
	MOVQ w+16(FP), R8
	MOVQ rows+24(FP), CX
	MOVQ R8, BX
	SHLQ $3, BX
	INCQ BX
	XORQ R9, R9

ham_row:
	MOVQ  SI, R11
	MOVQ  R8, R13
	VPXOR Y0, Y0, Y0
	VPXOR Y2, Y2, Y2

ham_64:
	CMPQ     R13, $64
	JLT      ham_32
	VMOVDQU  0(DX), Y1
	VMOVDQU  32(DX), Y3
	VPXOR    0(R11), Y1, Y1
	VPXOR    32(R11), Y3, Y3
	VPOPCNTQ Y1, Y1
	VPOPCNTQ Y3, Y3
	VPADDQ   Y1, Y0, Y0
	VPADDQ   Y3, Y2, Y2
	ADDQ     $64, DX
	ADDQ     $64, R11
	SUBQ     $64, R13
	JMP      ham_64

ham_32:
	TESTQ    R13, R13
	JZ       ham_sum
	VMOVDQU  0(DX), Y1
	VPXOR    0(R11), Y1, Y1
	VPOPCNTQ Y1, Y1
	VPADDQ   Y1, Y0, Y0
	ADDQ     $32, DX
	ADDQ     $32, R11
	SUBQ     $32, R13

ham_sum:
	VPADDQ       Y2, Y0, Y0
	VEXTRACTI128 $1, Y0, X1
	VPADDQ       X1, X0, X0
	VPSHUFD      $0x4e, X0, X1
	VPADDQ       X1, X0, X0
	MOVQ         X0, AX
	ADDQ         AX, R9
	CMPQ         AX, BX
	CMOVQLT      AX, BX
	DECQ         CX
	JNZ          ham_row
	VZEROUPPER
	MOVQ         BX, minDist+32(FP)
	MOVQ         R9, total+40(FP)
	RET

// func dotsF16x4AVX2(out, q *float32, v *byte, d, qs int)
// Four runs against one run of v (vs = 0: the query heads of a GQA group against their KV
// head's row): each fp16 vector of v is converted once for the four queries. Two accumulators
// per query (even and odd 8-element steps); the four sums leave together through a VHADDPS tree.
TEXT ·dotsF16x4AVX2(SB), NOSPLIT, $0-40
	MOVQ   out+0(FP), DI
	MOVQ   q+8(FP), SI
	MOVQ   v+16(FP), DX
	MOVQ   d+24(FP), CX
	MOVQ   qs+32(FP), R8
	SHLQ   $2, R8
	LEAQ   (SI)(R8*1), R9
	LEAQ   (R9)(R8*1), R10
	LEAQ   (R10)(R8*1), R11
	XORQ   AX, AX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

x4_16:
	CMPQ        CX, $16
	JLT         x4_8
	VCVTPH2PS   0(DX), Y8
	VCVTPH2PS   16(DX), Y9
	VFMADD231PS 0(SI)(AX*1), Y8, Y0
	VFMADD231PS 0(R9)(AX*1), Y8, Y1
	VFMADD231PS 0(R10)(AX*1), Y8, Y2
	VFMADD231PS 0(R11)(AX*1), Y8, Y3
	VFMADD231PS 32(SI)(AX*1), Y9, Y4
	VFMADD231PS 32(R9)(AX*1), Y9, Y5
	VFMADD231PS 32(R10)(AX*1), Y9, Y6
	VFMADD231PS 32(R11)(AX*1), Y9, Y7
	ADDQ        $32, DX
	ADDQ        $64, AX
	SUBQ        $16, CX
	JMP         x4_16

x4_8:
	TESTQ       CX, CX
	JZ          x4_sum
	VCVTPH2PS   0(DX), Y8
	VFMADD231PS 0(SI)(AX*1), Y8, Y0
	VFMADD231PS 0(R9)(AX*1), Y8, Y1
	VFMADD231PS 0(R10)(AX*1), Y8, Y2
	VFMADD231PS 0(R11)(AX*1), Y8, Y3

x4_sum:
	VADDPS       Y4, Y0, Y0
	VADDPS       Y5, Y1, Y1
	VADDPS       Y6, Y2, Y2
	VADDPS       Y7, Y3, Y3
	VHADDPS      Y1, Y0, Y0 // per 128-bit lane: a01 a23 b01 b23
	VHADDPS      Y3, Y2, Y2 // c01 c23 d01 d23
	VHADDPS      Y2, Y0, Y0 // a b c d of each lane's half
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VMOVUPS      X0, 0(DI)
	VZEROUPPER
	RET

// func hammingPlanesAVX512(codes *byte, planes *uint64, out *int32, w, chunks, nplanes, rows, n int)
//
// HammingTable's sums by bit planes (score.go): rows key codes of w bytes (w ≥ 32) at codes;
// planes is [nplanes+1][chunks][4] uint64: plane b holds bit b of every bit's query count, the
// last plane the mask of key bits that count. Chunk c of a row is its 32 bytes at 32c, except
// the last chunk, which is the row's last 32 bytes (w−32: it overlaps the one before when w is
// not a multiple of 32, and the mask and planes are zero there). Per row: ones = Σ
// popcount(k AND mask), dot = Σ_b 2^b·popcount(k AND plane_b) (VPOPCNTQ), and
// out = n·ones − 2·dot.
TEXT ·hammingPlanesAVX512(SB), NOSPLIT, $0-64
	MOVQ codes+0(FP), SI
	MOVQ planes+8(FP), R8
	MOVQ out+16(FP), DI
	MOVQ w+24(FP), R9
	MOVQ chunks+32(FP), R10
	MOVQ nplanes+40(FP), DX
	MOVQ rows+48(FP), CX
	MOVQ n+56(FP), R15
	MOVQ R10, R11
	SHLQ $5, R11        // a plane's bytes: chunks × 32
	LEAQ -32(R9), R13   // the last chunk's offset in a row

hp_row:
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	XORQ  R12, R12      // chunk c

hp_chunk:
	MOVQ    R12, BX
	SHLQ    $5, BX      // 32c
	LEAQ    1(R12), AX
	CMPQ    AX, R10
	CMOVQEQ R13, BX     // the last chunk: w − 32
	VMOVDQU (SI)(BX*1), Y2
	MOVQ    R12, R14
	SHLQ    $5, R14
	ADDQ    R8, R14     // plane 0, chunk c
	XORQ    AX, AX      // plane b

hp_plane:
	CMPQ     AX, DX
	JGE      hp_mask
	VPAND    (R14), Y2, Y4
	VPOPCNTQ Y4, Y4
	VMOVQ    AX, X5
	VPSLLQ   X5, Y4, Y4
	VPADDQ   Y4, Y1, Y1
	ADDQ     R11, R14
	INCQ     AX
	JMP      hp_plane

hp_mask:
	VPAND    (R14), Y2, Y4
	VPOPCNTQ Y4, Y4
	VPADDQ   Y4, Y0, Y0
	INCQ     R12
	CMPQ     R12, R10
	JLT      hp_chunk

	VEXTRACTI128 $1, Y0, X2
	VPADDQ       X2, X0, X0
	VPSHUFD      $0x4e, X0, X2
	VPADDQ       X2, X0, X0
	VMOVQ        X0, AX     // ones
	VEXTRACTI128 $1, Y1, X2
	VPADDQ       X2, X1, X1
	VPSHUFD      $0x4e, X1, X2
	VPADDQ       X2, X1, X1
	VMOVQ        X1, BX     // dot
	IMULQ        R15, AX
	SHLQ         $1, BX
	SUBQ         BX, AX
	MOVL         AX, (DI)
	ADDQ         $4, DI
	ADDQ         R9, SI
	DECQ         CX
	JNZ          hp_row
	VZEROUPPER
	RET

// func dotsF32AVX2(out, q, v *float32, n, d, qs, vs int)
// DotsF32 with eight float32 lanes (d a multiple of 8): four accumulators over 32 elements a
// step, then one over 8.
TEXT ·dotsF32AVX2(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ d+32(FP), R8
	MOVQ qs+40(FP), R9
	MOVQ vs+48(FP), R10
	SHLQ $2, R9
	SHLQ $2, R10

f32_row:
	MOVQ SI, R11
	MOVQ DX, R12
	MOVQ R8, R13
	ZERO4

f32_32:
	CMPQ        R13, $32
	JLT         f32_8
	VMOVUPS     0(R12), Y4
	VMOVUPS     32(R12), Y5
	VMOVUPS     64(R12), Y6
	VMOVUPS     96(R12), Y7
	VFMADD231PS 0(R11), Y4, Y0
	VFMADD231PS 32(R11), Y5, Y1
	VFMADD231PS 64(R11), Y6, Y2
	VFMADD231PS 96(R11), Y7, Y3
	ADDQ        $128, R12
	ADDQ        $128, R11
	SUBQ        $32, R13
	JMP         f32_32

f32_8:
	TESTQ       R13, R13
	JZ          f32_sum
	VMOVUPS     0(R12), Y4
	VFMADD231PS 0(R11), Y4, Y0
	ADDQ        $32, R12
	ADDQ        $32, R11
	SUBQ        $8, R13
	JMP         f32_8

f32_sum:
	HSUM4
	VMOVSS X0, 0(DI)
	ADDQ   $4, DI
	ADDQ   R9, SI
	ADDQ   R10, DX
	DECQ   CX
	JNZ    f32_row
	VZEROUPPER
	RET

// func dotsF32AVX512(out, q, v *float32, n, d, qs, vs int)
// DotsF32 with sixteen lanes (d a multiple of 16): four accumulators over 64 elements a step,
// then one over 16; the four are added and folded to eight lanes for HSUM4's tail.
TEXT ·dotsF32AVX512(SB), NOSPLIT, $0-56
	MOVQ out+0(FP), DI
	MOVQ q+8(FP), SI
	MOVQ v+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ d+32(FP), R8
	MOVQ qs+40(FP), R9
	MOVQ vs+48(FP), R10
	SHLQ $2, R9
	SHLQ $2, R10

z32_row:
	MOVQ   SI, R11
	MOVQ   DX, R12
	MOVQ   R8, R13
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3

z32_64:
	CMPQ        R13, $64
	JLT         z32_16
	VMOVUPS     0(R12), Z4
	VMOVUPS     64(R12), Z5
	VMOVUPS     128(R12), Z6
	VMOVUPS     192(R12), Z7
	VFMADD231PS 0(R11), Z4, Z0
	VFMADD231PS 64(R11), Z5, Z1
	VFMADD231PS 128(R11), Z6, Z2
	VFMADD231PS 192(R11), Z7, Z3
	ADDQ        $256, R12
	ADDQ        $256, R11
	SUBQ        $64, R13
	JMP         z32_64

z32_16:
	TESTQ       R13, R13
	JZ          z32_sum
	VMOVUPS     0(R12), Z4
	VFMADD231PS 0(R11), Z4, Z0
	ADDQ        $64, R12
	ADDQ        $64, R11
	SUBQ        $16, R13
	JMP         z32_16

z32_sum:
	VADDPS        Z1, Z0, Z0
	VADDPS        Z3, Z2, Z2
	VADDPS        Z2, Z0, Z0
	VEXTRACTF64X4 $1, Z0, Y1
	VADDPS        Y1, Y0, Y0
	VEXTRACTF128  $1, Y0, X1
	VADDPS        X1, X0, X0
	VHADDPS       X0, X0, X0
	VHADDPS       X0, X0, X0
	VMOVSS        X0, 0(DI)
	ADDQ          $4, DI
	ADDQ          R9, SI
	ADDQ          R10, DX
	DECQ          CX
	JNZ           z32_row
	VZEROUPPER
	RET

// func dotsF16Rows4AVX2(out, q *float32, v *byte, mx *float32, n, d, qs, vs, os int)
// Four query runs (q + j·qs·4) against n rows of v (row r at v + r·vs·2), n even: two rows a
// step, each fp16 vector converted once for the four queries, eight accumulators (row × query).
// The eight sums leave together: a VHADDPS tree and one cross-lane add give row r's four
// results, stored at out + r·os·4. mx holds eight running maxima (row parity × query): a NaN
// result never replaces one (VMAXPS returns its second source when either is NaN).
TEXT ·dotsF16Rows4AVX2(SB), NOSPLIT, $0-72
	MOVQ    out+0(FP), DI
	MOVQ    q+8(FP), SI
	MOVQ    v+16(FP), DX
	MOVQ    mx+24(FP), AX
	VMOVUPS (AX), Y15
	MOVQ    n+32(FP), CX
	MOVQ    d+40(FP), R8
	MOVQ    qs+48(FP), R9
	MOVQ    vs+56(FP), R12
	MOVQ    os+64(FP), R13
	SHLQ    $2, R9
	SHLQ    $1, R12
	SHLQ    $2, R13
	LEAQ    (SI)(R9*1), R10
	LEAQ    (R10)(R9*1), R11
	LEAQ    (R11)(R9*1), R9 // SI, R10, R11, R9: queries 0 to 3
	SHRQ    $1, CX

r4_pair:
	LEAQ       (DX)(R12*1), BX
	// The rows thirty-two ahead, into cache: strided rows (a KV head's among the others) outrun the
	// hardware prefetchers. Their first two lines and last byte; past the array is harmless.
	MOVQ       R12, AX
	SHLQ       $5, AX
	ADDQ       DX, AX
	PREFETCHT0 (AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 -1(AX)(R8*2)
	ADDQ       R12, AX
	PREFETCHT0 (AX)
	PREFETCHT0 64(AX)
	PREFETCHT0 -1(AX)(R8*2)
	XORQ       AX, AX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

r4_8:
	VCVTPH2PS   (DX)(AX*2), Y8
	VCVTPH2PS   (BX)(AX*2), Y9
	VMOVUPS     (SI)(AX*4), Y10
	VMOVUPS     (R10)(AX*4), Y11
	VMOVUPS     (R11)(AX*4), Y12
	VMOVUPS     (R9)(AX*4), Y13
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ        $8, AX
	CMPQ        AX, R8
	JLT         r4_8

	VHADDPS      Y1, Y0, Y0 // per 128-bit lane: q0 q0 q1 q1 (pairs of partial sums)
	VHADDPS      Y3, Y2, Y2
	VHADDPS      Y2, Y0, Y0 // row 0: q0 q1 q2 q3 of each lane's half
	VHADDPS      Y5, Y4, Y4
	VHADDPS      Y7, Y6, Y6
	VHADDPS      Y6, Y4, Y4 // row 1
	VPERM2F128   $0x20, Y4, Y0, Y1 // low halves: row 0 | row 1
	VPERM2F128   $0x31, Y4, Y0, Y2 // high halves
	VADDPS       Y2, Y1, Y1
	VMAXPS       Y15, Y1, Y15 // Intel vmaxps y15, y1, y15: y1 > y15 ? y1 : y15
	VMOVUPS      X1, (DI)
	VEXTRACTF128 $1, Y1, (DI)(R13*1)
	LEAQ         (DI)(R13*2), DI
	LEAQ         (DX)(R12*2), DX
	DECQ         CX
	JNZ          r4_pair
	MOVQ         mx+24(FP), AX
	VMOVUPS      Y15, (AX)
	VZEROUPPER
	RET

// func sumRows4AVX2(out, x *float32, blocks, m int)
// Rows of four columns, m (even) rows a block: out + b·16 receives block b's four column sums.
// Two rows are one vector; four accumulators take four vectors a step, then one at a time; the
// halves (even and odd rows) are added at the end of the block.
TEXT ·sumRows4AVX2(SB), NOSPLIT, $0-32
	MOVQ out+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ blocks+16(FP), CX
	MOVQ m+24(FP), R8
	SHRQ $1, R8 // vectors a block

s4_block:
	MOVQ   R8, R9
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

s4_4:
	CMPQ   R9, $4
	JLT    s4_1
	VADDPS 0(SI), Y0, Y0
	VADDPS 32(SI), Y1, Y1
	VADDPS 64(SI), Y2, Y2
	VADDPS 96(SI), Y3, Y3
	ADDQ   $128, SI
	SUBQ   $4, R9
	JMP    s4_4

s4_1:
	TESTQ  R9, R9
	JZ     s4_sum
	VADDPS 0(SI), Y0, Y0
	ADDQ   $32, SI
	DECQ   R9
	JMP    s4_1

s4_sum:
	VADDPS       Y1, Y0, Y0
	VADDPS       Y3, Y2, Y2
	VADDPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS       X1, X0, X0
	VMOVUPS      X0, (DI)
	ADDQ         $16, DI
	DECQ         CX
	JNZ          s4_block
	VZEROUPPER
	RET
