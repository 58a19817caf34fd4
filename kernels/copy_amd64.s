#include "textflag.h"

// func copyPF(dst, src *byte, n int, pf *byte, nt bool)
//
// n > 0 is a multiple of 128; with nt, dst is 32-byte aligned. Copies n bytes with unaligned
// 32-byte loads and 32-byte stores (non-temporal with nt), and for each 128 bytes copied at
// +i prefetches the 128 bytes at pf+i (bytes a gather reads a little later, from another run)
// with PREFETCHT0, in both loops. Not PREFETCHNTA: on an Intel Xeon it halved the gathers
// (4.8–5.5 GB/s against 9.9–11.6 with T0; docs/kernels.md, "The prefetch hint"), the lines it
// fetches are not kept where the copy looks for them a few microseconds later. Prefetches
// never fault.
TEXT ·copyPF(SB), NOSPLIT, $0-33
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVQ pf+24(FP), DX
	MOVB nt+32(FP), AX
	TESTB AL, AL
	JNZ  ntloop

tloop:
	PREFETCHT0 0(DX)
	PREFETCHT0 64(DX)
	VMOVDQU    0(SI), Y0
	VMOVDQU    32(SI), Y1
	VMOVDQU    64(SI), Y2
	VMOVDQU    96(SI), Y3
	VMOVDQU    Y0, 0(DI)
	VMOVDQU    Y1, 32(DI)
	VMOVDQU    Y2, 64(DI)
	VMOVDQU    Y3, 96(DI)
	ADDQ       $128, SI
	ADDQ       $128, DI
	ADDQ       $128, DX
	SUBQ       $128, CX
	JNZ        tloop
	VZEROUPPER
	RET

ntloop:
	PREFETCHT0 0(DX)
	PREFETCHT0 64(DX)
	VMOVDQU    0(SI), Y0
	VMOVDQU    32(SI), Y1
	VMOVDQU    64(SI), Y2
	VMOVDQU    96(SI), Y3
	VMOVNTDQ   Y0, 0(DI)
	VMOVNTDQ   Y1, 32(DI)
	VMOVNTDQ   Y2, 64(DI)
	VMOVNTDQ   Y3, 96(DI)
	ADDQ       $128, SI
	ADDQ       $128, DI
	ADDQ       $128, DX
	SUBQ       $128, CX
	JNZ        ntloop
	VZEROUPPER
	RET

// func prefetch(p *byte, n int)
//
// PREFETCHT0 of every 64-byte line in [p, p+n), n > 0: the lines a copy will read next.
// Prefetches never fault.
TEXT ·prefetch(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), SI
	MOVQ n+8(FP), CX
	ADDQ SI, CX

ploop:
	PREFETCHT0 0(SI)
	ADDQ       $64, SI
	CMPQ       SI, CX
	JB         ploop
	RET
