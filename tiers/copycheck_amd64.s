#include "textflag.h"

// func copyCRC3(d0, s0, d1, s1, d2, s2 *byte, n int, c0, c1, c2 uint32) (r0, r1, r2 uint32)
//
// Three streams, 8 bytes each per iteration: load, store, CRC32Q. The pointers are advanced to
// the end and indexed by CX, which counts up from -n to 0.
TEXT ·copyCRC3(SB), NOSPLIT, $0-84
	MOVQ d0+0(FP), DI
	MOVQ s0+8(FP), SI
	MOVQ d1+16(FP), R8
	MOVQ s1+24(FP), R9
	MOVQ d2+32(FP), R10
	MOVQ s2+40(FP), R11
	MOVQ n+48(FP), CX
	MOVL c0+56(FP), AX
	MOVL c1+60(FP), BX
	MOVL c2+64(FP), DX
	ADDQ CX, DI
	ADDQ CX, SI
	ADDQ CX, R8
	ADDQ CX, R9
	ADDQ CX, R10
	ADDQ CX, R11
	NEGQ CX

loop:
	MOVQ (SI)(CX*1), R12
	MOVQ (R9)(CX*1), R13
	MOVQ (R11)(CX*1), R14
	MOVQ R12, (DI)(CX*1)
	MOVQ R13, (R8)(CX*1)
	MOVQ R14, (R10)(CX*1)
	CRC32Q R12, AX
	CRC32Q R13, BX
	CRC32Q R14, DX
	ADDQ $8, CX
	JNZ  loop

	MOVL AX, r0+72(FP)
	MOVL BX, r1+76(FP)
	MOVL DX, r2+80(FP)
	RET

