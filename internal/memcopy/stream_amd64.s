#include "textflag.h"

// func copyNT(dst, src *byte, n int)
//
// n > 0 is a multiple of 128 and dst is 32-byte aligned: unaligned 32-byte loads, 32-byte
// non-temporal stores (written around the caches, as runtime·memmove does for copies of 1 MiB
// and more). The caller issues sfence before the copied bytes are published.
TEXT ·copyNT(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX

loop:
	VMOVDQU  0(SI), Y0
	VMOVDQU  32(SI), Y1
	VMOVDQU  64(SI), Y2
	VMOVDQU  96(SI), Y3
	VMOVNTDQ Y0, 0(DI)
	VMOVNTDQ Y1, 32(DI)
	VMOVNTDQ Y2, 64(DI)
	VMOVNTDQ Y3, 96(DI)
	ADDQ     $128, SI
	ADDQ     $128, DI
	SUBQ     $128, CX
	JNZ      loop
	VZEROUPPER
	RET

// func sfence()
TEXT ·sfence(SB), NOSPLIT, $0-0
	SFENCE
	RET
