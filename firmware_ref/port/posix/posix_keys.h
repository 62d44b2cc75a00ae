/* The posix device's long-term keys (--key-file, IDL_AUTH=1): read once at start from a private
 * key file, the format the host and `idemlink sim` read (protocol/key_file.py). */
#ifndef IDL_POSIX_KEYS_H
#define IDL_POSIX_KEYS_H

/** Read the keys of `path` (NULL: none, the device is unkeyed). The file must be a regular file
 *  whose mode gives nothing to group or others (0600 or stricter), at most 4096 bytes, one key a
 *  line (64 hex digits; blank lines and '#' comments ignored), 1..4 keys, the current one first.
 *  Anything else: one line on stderr naming the file (never its content), exit 1. */
void idl_posix_keys_load(const char *path);

#endif /* IDL_POSIX_KEYS_H */
