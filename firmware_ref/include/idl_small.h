/**
 * @file idl_small.h
 * @brief IDL_SMALL_CODE: where the core has two equivalent implementations of a hot loop (the
 *        frame decoder's scan for the delimiter; the CRC-32C nibble loop: four basis rows, 16 B,
 *        a byte at a time, or the 64-byte table four bytes at a time), 1 picks the smaller,
 *        0 the faster. Default: 1 when the compiler optimises for size (-Os), like
 *        IDL_WINDOW_SMALL. Both give identical results: `make check` builds -O2 and -Os, and the
 *        tests run on both.
 */
#ifndef IDL_SMALL_H
#define IDL_SMALL_H

#ifndef IDL_SMALL_CODE
#ifdef __OPTIMIZE_SIZE__
#define IDL_SMALL_CODE 1
#else
#define IDL_SMALL_CODE 0
#endif
#endif

#endif /* IDL_SMALL_H */
