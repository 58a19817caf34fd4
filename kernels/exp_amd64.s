#include "textflag.h"

// ExpColumns (exp.go) eight columns at a time. Every constant of the computation is a vector of
// eight equal lanes in expc; the polynomial and reduction constants stay in Y7–Y15.
// 0: log2 e
DATA expc<>+0(SB)/4, $0x3fb8aa3b
DATA expc<>+4(SB)/4, $0x3fb8aa3b
DATA expc<>+8(SB)/4, $0x3fb8aa3b
DATA expc<>+12(SB)/4, $0x3fb8aa3b
DATA expc<>+16(SB)/4, $0x3fb8aa3b
DATA expc<>+20(SB)/4, $0x3fb8aa3b
DATA expc<>+24(SB)/4, $0x3fb8aa3b
DATA expc<>+28(SB)/4, $0x3fb8aa3b
// 32: ln2hi (exact times n)
DATA expc<>+32(SB)/4, $0x3f318000
DATA expc<>+36(SB)/4, $0x3f318000
DATA expc<>+40(SB)/4, $0x3f318000
DATA expc<>+44(SB)/4, $0x3f318000
DATA expc<>+48(SB)/4, $0x3f318000
DATA expc<>+52(SB)/4, $0x3f318000
DATA expc<>+56(SB)/4, $0x3f318000
DATA expc<>+60(SB)/4, $0x3f318000
// 64: ln2 − ln2hi
DATA expc<>+64(SB)/4, $0xb95e8083
DATA expc<>+68(SB)/4, $0xb95e8083
DATA expc<>+72(SB)/4, $0xb95e8083
DATA expc<>+76(SB)/4, $0xb95e8083
DATA expc<>+80(SB)/4, $0xb95e8083
DATA expc<>+84(SB)/4, $0xb95e8083
DATA expc<>+88(SB)/4, $0xb95e8083
DATA expc<>+92(SB)/4, $0xb95e8083
// 96: 1/7!
DATA expc<>+96(SB)/4, $0x39500d01
DATA expc<>+100(SB)/4, $0x39500d01
DATA expc<>+104(SB)/4, $0x39500d01
DATA expc<>+108(SB)/4, $0x39500d01
DATA expc<>+112(SB)/4, $0x39500d01
DATA expc<>+116(SB)/4, $0x39500d01
DATA expc<>+120(SB)/4, $0x39500d01
DATA expc<>+124(SB)/4, $0x39500d01
// 128: 1/6!
DATA expc<>+128(SB)/4, $0x3ab60b61
DATA expc<>+132(SB)/4, $0x3ab60b61
DATA expc<>+136(SB)/4, $0x3ab60b61
DATA expc<>+140(SB)/4, $0x3ab60b61
DATA expc<>+144(SB)/4, $0x3ab60b61
DATA expc<>+148(SB)/4, $0x3ab60b61
DATA expc<>+152(SB)/4, $0x3ab60b61
DATA expc<>+156(SB)/4, $0x3ab60b61
// 160: 1/5!
DATA expc<>+160(SB)/4, $0x3c088889
DATA expc<>+164(SB)/4, $0x3c088889
DATA expc<>+168(SB)/4, $0x3c088889
DATA expc<>+172(SB)/4, $0x3c088889
DATA expc<>+176(SB)/4, $0x3c088889
DATA expc<>+180(SB)/4, $0x3c088889
DATA expc<>+184(SB)/4, $0x3c088889
DATA expc<>+188(SB)/4, $0x3c088889
// 192: 1/4!
DATA expc<>+192(SB)/4, $0x3d2aaaab
DATA expc<>+196(SB)/4, $0x3d2aaaab
DATA expc<>+200(SB)/4, $0x3d2aaaab
DATA expc<>+204(SB)/4, $0x3d2aaaab
DATA expc<>+208(SB)/4, $0x3d2aaaab
DATA expc<>+212(SB)/4, $0x3d2aaaab
DATA expc<>+216(SB)/4, $0x3d2aaaab
DATA expc<>+220(SB)/4, $0x3d2aaaab
// 224: 1/3!
DATA expc<>+224(SB)/4, $0x3e2aaaab
DATA expc<>+228(SB)/4, $0x3e2aaaab
DATA expc<>+232(SB)/4, $0x3e2aaaab
DATA expc<>+236(SB)/4, $0x3e2aaaab
DATA expc<>+240(SB)/4, $0x3e2aaaab
DATA expc<>+244(SB)/4, $0x3e2aaaab
DATA expc<>+248(SB)/4, $0x3e2aaaab
DATA expc<>+252(SB)/4, $0x3e2aaaab
// 256: 1/2
DATA expc<>+256(SB)/4, $0x3f000000
DATA expc<>+260(SB)/4, $0x3f000000
DATA expc<>+264(SB)/4, $0x3f000000
DATA expc<>+268(SB)/4, $0x3f000000
DATA expc<>+272(SB)/4, $0x3f000000
DATA expc<>+276(SB)/4, $0x3f000000
DATA expc<>+280(SB)/4, $0x3f000000
DATA expc<>+284(SB)/4, $0x3f000000
// 288: 1
DATA expc<>+288(SB)/4, $0x3f800000
DATA expc<>+292(SB)/4, $0x3f800000
DATA expc<>+296(SB)/4, $0x3f800000
DATA expc<>+300(SB)/4, $0x3f800000
DATA expc<>+304(SB)/4, $0x3f800000
DATA expc<>+308(SB)/4, $0x3f800000
DATA expc<>+312(SB)/4, $0x3f800000
DATA expc<>+316(SB)/4, $0x3f800000
// 320: ExpMin
DATA expc<>+320(SB)/4, $0xc2aeac4f
DATA expc<>+324(SB)/4, $0xc2aeac4f
DATA expc<>+328(SB)/4, $0xc2aeac4f
DATA expc<>+332(SB)/4, $0xc2aeac4f
DATA expc<>+336(SB)/4, $0xc2aeac4f
DATA expc<>+340(SB)/4, $0xc2aeac4f
DATA expc<>+344(SB)/4, $0xc2aeac4f
DATA expc<>+348(SB)/4, $0xc2aeac4f
// 352: expHi 88.75
DATA expc<>+352(SB)/4, $0x42b18000
DATA expc<>+356(SB)/4, $0x42b18000
DATA expc<>+360(SB)/4, $0x42b18000
DATA expc<>+364(SB)/4, $0x42b18000
DATA expc<>+368(SB)/4, $0x42b18000
DATA expc<>+372(SB)/4, $0x42b18000
DATA expc<>+376(SB)/4, $0x42b18000
DATA expc<>+380(SB)/4, $0x42b18000
// 384: int32 127, the exponent bias
DATA expc<>+384(SB)/4, $0x0000007f
DATA expc<>+388(SB)/4, $0x0000007f
DATA expc<>+392(SB)/4, $0x0000007f
DATA expc<>+396(SB)/4, $0x0000007f
DATA expc<>+400(SB)/4, $0x0000007f
DATA expc<>+404(SB)/4, $0x0000007f
DATA expc<>+408(SB)/4, $0x0000007f
DATA expc<>+412(SB)/4, $0x0000007f
GLOBL expc<>(SB), RODATA|NOPTR, $416

// func expColumnsAVX2(x, shift, sum *float32, rows, cols int)
TEXT ·expColumnsAVX2(SB), NOSPLIT, $0-40
	MOVQ    x+0(FP), DI
	MOVQ    shift+8(FP), SI
	MOVQ    sum+16(FP), DX
	MOVQ    rows+24(FP), CX
	MOVQ    cols+32(FP), R8
	SHLQ    $2, R8
	VMOVUPS expc<>+0(SB), Y15   // log2 e
	VMOVUPS expc<>+32(SB), Y14  // ln2hi
	VMOVUPS expc<>+64(SB), Y13  // ln2lo
	VMOVUPS expc<>+96(SB), Y12  // 1/7!
	VMOVUPS expc<>+128(SB), Y11 // 1/6!
	VMOVUPS expc<>+160(SB), Y10 // 1/5!
	VMOVUPS expc<>+192(SB), Y9  // 1/4!
	VMOVUPS expc<>+224(SB), Y8  // 1/3!
	VMOVUPS expc<>+256(SB), Y7  // 1/2

exp_row:
	XORQ R9, R9

exp_8:
	VMOVUPS      (DI)(R9*1), Y0
	VSUBPS       (SI)(R9*1), Y0, Y0         // t = x − shift
	VCMPPS       $0x1d, expc<>+320(SB), Y0, Y6 // keep: t ≥ ExpMin (false for NaN)
	VMINPS       expc<>+352(SB), Y0, Y0     // t ≤ 88.75 (NaN becomes 88.75, then dropped)
	VMAXPS       expc<>+320(SB), Y0, Y0     // t ≥ ExpMin: n stays in [−126, 128]
	VMULPS       Y15, Y0, Y1
	VROUNDPS     $0, Y1, Y1                 // n = round(t·log2 e), ties to even
	VFNMADD231PS Y14, Y1, Y0                // t − n·ln2hi (exact)
	VFNMADD231PS Y13, Y1, Y0                // r = t − n·ln2
	VMOVAPS      Y12, Y2
	VFMADD213PS  Y11, Y0, Y2                // p = p·r + c
	VFMADD213PS  Y10, Y0, Y2
	VFMADD213PS  Y9, Y0, Y2
	VFMADD213PS  Y8, Y0, Y2
	VFMADD213PS  Y7, Y0, Y2
	VFMADD213PS  expc<>+288(SB), Y0, Y2
	VFMADD213PS  expc<>+288(SB), Y0, Y2     // p = e^r
	VCVTPS2DQ    Y1, Y3                     // n
	VPSRAD       $1, Y3, Y4                 // n1 = n >> 1
	VPSUBD       Y4, Y3, Y3                 // n2 = n − n1
	VPADDD       expc<>+384(SB), Y4, Y4
	VPSLLD       $23, Y4, Y4                // 2^n1
	VPADDD       expc<>+384(SB), Y3, Y3
	VPSLLD       $23, Y3, Y3                // 2^n2
	VMULPS       Y4, Y2, Y2
	VMULPS       Y3, Y2, Y2
	VANDPS       Y6, Y2, Y2                 // 0 where not kept
	VMOVUPS      Y2, (DI)(R9*1)
	VADDPS       (DX)(R9*1), Y2, Y2
	VMOVUPS      Y2, (DX)(R9*1)
	ADDQ         $32, R9
	CMPQ         R9, R8
	JLT          exp_8

	ADDQ R8, DI
	DECQ CX
	JNZ  exp_row
	VZEROUPPER
	RET
