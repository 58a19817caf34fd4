#include "textflag.h"

// func projSignsAVX2(dst *byte, x, w *float32, n, stride, chunks int)
//
// The hash projection's signs, 32 projections (one chunk) at a time: for chunk c, columns
// 32c … 32c+31 of W (row-major [n][stride] float32), p_j = Σ_i x_i·W[i][j] accumulated in
// index order with a multiply then an add (never fused), exactly as the scalar loop of
// hash.go rounds; the four bytes at dst+4c get bit l of byte k set iff p_{32c+8k+l} > 0.
TEXT ·projSignsAVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ stride+32(FP), R8
	MOVQ chunks+40(FP), R9
	SHLQ $2, R8
	VXORPS Y15, Y15, Y15

proj_chunk:
	MOVQ   SI, R10
	MOVQ   DX, R11
	MOVQ   CX, R12
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

proj_row:
	VBROADCASTSS 0(R10), Y4
	VMULPS       0(R11), Y4, Y5
	VMULPS       32(R11), Y4, Y6
	VMULPS       64(R11), Y4, Y7
	VMULPS       96(R11), Y4, Y8
	VADDPS       Y5, Y0, Y0
	VADDPS       Y6, Y1, Y1
	VADDPS       Y7, Y2, Y2
	VADDPS       Y8, Y3, Y3
	ADDQ         $4, R10
	ADDQ         R8, R11
	DECQ         R12
	JNZ          proj_row

	VCMPPS    $0x1e, Y15, Y0, Y0 // GT_OQ: p > 0 (false for NaN)
	VCMPPS    $0x1e, Y15, Y1, Y1
	VCMPPS    $0x1e, Y15, Y2, Y2
	VCMPPS    $0x1e, Y15, Y3, Y3
	VMOVMSKPS Y0, AX
	MOVB      AX, 0(DI)
	VMOVMSKPS Y1, AX
	MOVB      AX, 1(DI)
	VMOVMSKPS Y2, AX
	MOVB      AX, 2(DI)
	VMOVMSKPS Y3, AX
	MOVB      AX, 3(DI)
	ADDQ      $4, DI
	ADDQ      $128, DX
	DECQ      R9
	JNZ       proj_chunk
	VZEROUPPER
	RET
