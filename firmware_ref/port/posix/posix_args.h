/* The posix device's command line (see main.c for what each option does): parsed into one
 * record, every value checked. A bad value is one line on stderr and exit 1; an unknown option,
 * a missing value or a number that is not one, the usage line and exit 2. */
#ifndef IDL_POSIX_ARGS_H
#define IDL_POSIX_ARGS_H

typedef struct {
    const char *port;      /* --port PATH; NULL: a pseudo-terminal */
    const char *flash_dir; /* --flash-dir DIR; NULL: nothing kept */
    const char *device_id; /* --device-id ID (checked); NULL: from the flash or drawn */
    const char *effects;   /* --effects FILE */
    const char *control;   /* --control FIFO */
    unsigned long long seed; /* --seed N when have_seed */
    int have_seed;
    int print_stats;       /* --stats */
    int rtu_mode;          /* --modbus-rtu */
    long unit;             /* --unit 1..247 (default 1) */
    long baudrate;         /* --baudrate (default 115200) */
    long bytesize;         /* --bytesize 7|8 (default 8) */
    long stopbits;         /* --stopbits 1|2 (default 1) */
    char parity;           /* --parity 'N'|'E'|'O' (default 'N', 'E' with --modbus-rtu) */
    double trigger_s;      /* --trigger-duration SECONDS (default IDL_TRIGGER_MS) */
    long address;          /* --address 1..247 (IDL_BUS=1: the bus address); 0: not given */
    const char *key_file;  /* --key-file FILE (IDL_AUTH=1: the device's keys); NULL: unkeyed */
} idl_posix_args_t;

/** Parse argv into *a (defaults first); exits on anything wrong, as said above. */
void idl_posix_args_parse(idl_posix_args_t *a, int argc, char **argv);

#endif /* IDL_POSIX_ARGS_H */
