/**
 * @file idl_checkreturn.h
 * @brief IDL_CHECKRETURN marks every API function whose result must be looked at (nanopb's
 *        `checkreturn`): an ignored verdict, length or success flag is a bug that compiles. With
 *        gcc and clang it is `warn_unused_result`, so `make check` (-Werror) fails on a call that
 *        drops the result (tests/ignored_result.c proves it does). gcc does not accept a `(void)`
 *        cast as using the result: a caller that truly does not need it says so by assigning it
 *        (`ok = f(...); (void)ok;`). Define IDL_CHECKRETURN empty to turn the check off.
 */
#ifndef IDL_CHECKRETURN_H
#define IDL_CHECKRETURN_H

#ifndef IDL_CHECKRETURN
#if defined(__GNUC__) || defined(__clang__)
#define IDL_CHECKRETURN __attribute__((warn_unused_result))
#else
#define IDL_CHECKRETURN
#endif
#endif

#endif /* IDL_CHECKRETURN_H */
