#include "textflag.h"

// func projSignsAVX2(dst *byte, x, w *float32, n, stride, chunks int)
//
// The hash projection's signs, 32 projections (one chunk) at a time, two chunks a pass while
// two are left: for chunk c, columns 32c … 32c+31 of W (row-major [n][stride] float32),
// p_j = Σ_i x_i·W[i][j] accumulated in index order with a multiply then an add (never fused),
// exactly as the scalar loop of hash.go rounds; the four bytes at dst+4c get bit l of byte k
// set iff p_{32c+8k+l} > 0. Eight accumulators per pass keep two adds in flight per cycle
// (each lane's add waits for its previous one: four accumulators would be latency-bound).

// MULADD4(off, A, B, C, D): the four accumulators add x_i (in Y8) times W's 32 floats at
// R11+off, multiplied then added (never fused).
#define MULADD4(off, A, B, C, D) \
	VMULPS off+0(R11), Y8, Y9 \
	VMULPS off+32(R11), Y8, Y10 \
	VMULPS off+64(R11), Y8, Y11 \
	VMULPS off+96(R11), Y8, Y12 \
	VADDPS Y9, A, A \
	VADDPS Y10, B, B \
	VADDPS Y11, C, C \
	VADDPS Y12, D, D

// SIGNS(Y, k): byte k of dst gets the signs of Y's lanes (> 0; false for NaN).
#define SIGNS(Y, k) \
	VCMPPS    $0x1e, Y15, Y, Y \
	VMOVMSKPS Y, AX \
	MOVB      AX, k(DI)

TEXT ·projSignsAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ stride+32(FP), R8
	MOVQ chunks+40(FP), R9
	SHLQ $2, R8
	VXORPS Y15, Y15, Y15

proj_pair:
	CMPQ   R9, $2
	JLT    proj_one
	MOVQ   SI, R10
	MOVQ   DX, R11
	MOVQ   CX, R12
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

proj_pair_row:
	VBROADCASTSS 0(R10), Y8
	MULADD4(0, Y0, Y1, Y2, Y3)
	MULADD4(128, Y4, Y5, Y6, Y7)
	ADDQ         $4, R10
	ADDQ         R8, R11
	DECQ         R12
	JNZ          proj_pair_row

	SIGNS(Y0, 0)
	SIGNS(Y1, 1)
	SIGNS(Y2, 2)
	SIGNS(Y3, 3)
	SIGNS(Y4, 4)
	SIGNS(Y5, 5)
	SIGNS(Y6, 6)
	SIGNS(Y7, 7)
	ADDQ $8, DI
	ADDQ $256, DX
	SUBQ $2, R9
	JMP  proj_pair

proj_one:
	TESTQ  R9, R9
	JZ     proj_done
	MOVQ   SI, R10
	MOVQ   DX, R11
	MOVQ   CX, R12
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

proj_one_row:
	VBROADCASTSS 0(R10), Y8
	MULADD4(0, Y0, Y1, Y2, Y3)
	ADDQ         $4, R10
	ADDQ         R8, R11
	DECQ         R12
	JNZ          proj_one_row

	SIGNS(Y0, 0)
	SIGNS(Y1, 1)
	SIGNS(Y2, 2)
	SIGNS(Y3, 3)

proj_done:
	VZEROUPPER
	RET
