/* The posix device's command line: see posix_args.h. */
#include "posix_args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idl_port.h"
#include "posix_common.h"
#include "posix_flash.h"

static long parse_long(const char *opt, const char *text)
{
    char *end;
    long v;
    errno = 0;
    v = strtol(text, &end, 10);
    if (errno != 0 || *end != '\0' || end == text) {
        fprintf(stderr, PROG ": %s: %s is not an integer\n", opt, text);
        exit(2);
    }
    return v;
}

static void usage(void)
{
    fprintf(stderr, "usage: " PROG " [--port PATH] [--flash-dir DIR] [--device-id ID] [--seed N] "
                    "[--trigger-duration SECONDS] [--baudrate N] [--bytesize 7|8] "
                    "[--parity N|E|O] [--stopbits 1|2] [--stats] [--effects FILE] "
                    "[--control FIFO] [--modbus-rtu [--unit N]] [--address N] [--key-file FILE]\n");
    exit(2);
}

void idl_posix_args_parse(idl_posix_args_t *a, int argc, char **argv)
{
    int i;
    memset(a, 0, sizeof *a);
    a->baudrate = 115200;
    a->bytesize = 8;
    a->stopbits = 1;
    a->parity = 0; /* not given: 'N', or 'E' with --modbus-rtu */
    a->unit = 1;
    a->trigger_s = IDL_TRIGGER_MS / 1000.0;
    for (i = 1; i < argc; i++) {
        const char *opt = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(opt, "-h") == 0 || strcmp(opt, "--help") == 0) {
            usage();
        }
        if (strcmp(opt, "--stats") == 0) {
            a->print_stats = 1;
            continue;
        }
        if (strcmp(opt, "--modbus-rtu") == 0) {
            a->rtu_mode = 1;
            continue;
        }
        if (val == NULL) {
            usage();
        }
        i++;
        if (strcmp(opt, "--port") == 0) {
            a->port = val;
        } else if (strcmp(opt, "--flash-dir") == 0) {
            a->flash_dir = val;
        } else if (strcmp(opt, "--effects") == 0) {
            a->effects = val;
        } else if (strcmp(opt, "--control") == 0) {
            a->control = val;
        } else if (strcmp(opt, "--key-file") == 0) {
            a->key_file = val;
        } else if (strcmp(opt, "--device-id") == 0) {
            if (!idl_posix_valid_id(val, strlen(val))) {
                fprintf(stderr, PROG ": device id '%s' must be 1-64 characters of "
                                "[A-Za-z0-9_.:-], starting with a letter or digit\n", val);
                exit(1);
            }
            a->device_id = val;
        } else if (strcmp(opt, "--seed") == 0) {
            a->seed = (unsigned long long)parse_long(opt, val);
            a->have_seed = 1;
        } else if (strcmp(opt, "--baudrate") == 0) {
            a->baudrate = parse_long(opt, val);
            if (a->baudrate <= 0 || a->baudrate > 20000000) {
                fprintf(stderr, PROG ": baud rate %ld must be 1..20000000\n", a->baudrate);
                exit(1);
            }
        } else if (strcmp(opt, "--bytesize") == 0) {
            a->bytesize = parse_long(opt, val);
            if (a->bytesize != 7 && a->bytesize != 8) {
                fprintf(stderr, PROG ": byte size %ld must be 7 or 8\n", a->bytesize);
                exit(1);
            }
        } else if (strcmp(opt, "--stopbits") == 0) {
            a->stopbits = parse_long(opt, val);
            if (a->stopbits != 1 && a->stopbits != 2) {
                fprintf(stderr, PROG ": stop bits %ld must be 1 or 2\n", a->stopbits);
                exit(1);
            }
        } else if (strcmp(opt, "--parity") == 0) {
            if (val[0] == '\0' || val[1] != '\0' || strchr("NEOneo", val[0]) == NULL) {
                fprintf(stderr, PROG ": parity '%s' must be N, E or O\n", val);
                exit(1);
            }
            a->parity = val[0] == 'n' ? 'N' : val[0] == 'e' ? 'E' : val[0] == 'o' ? 'O' : val[0];
        } else if (strcmp(opt, "--address") == 0) {
            a->address = parse_long(opt, val);
            if (a->address < 1 || a->address > 247 || !IDL_BUS) {
                fprintf(stderr, PROG ": --address %ld: %s\n", a->address,
                        IDL_BUS ? "a bus address is 1..247" : "built without IDL_BUS=1");
                exit(1);
            }
        } else if (strcmp(opt, "--unit") == 0) {
            a->unit = parse_long(opt, val);
            if (a->unit < 1 || a->unit > 247) {
                fprintf(stderr, PROG ": unit id %ld outside 1..247\n", a->unit);
                exit(1);
            }
        } else if (strcmp(opt, "--trigger-duration") == 0 || strcmp(opt, "--trigger-seconds") == 0) {
            char *end;
            a->trigger_s = strtod(val, &end);
            if (*end != '\0' || end == val) {
                fprintf(stderr, PROG ": %s: %s is not a number\n", opt, val);
                exit(2);
            }
            /* like `idemlink sim`; the core counts milliseconds in 32 bits (49.7 days) */
            if (!(a->trigger_s >= 0.0 && a->trigger_s <= 4.0e6)) {
                fprintf(stderr, PROG ": trigger duration %s must be a finite number of seconds "
                                ">= 0 (at most 4000000)\n", val);
                exit(1);
            }
        } else {
            usage();
        }
    }
    if (a->parity == 0) {
        a->parity = a->rtu_mode ? 'E' : 'N'; /* Modbus RTU's default framing is 8E1 */
    }
}
