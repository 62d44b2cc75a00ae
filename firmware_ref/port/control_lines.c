/* The control lines' rule: see control_lines.h. */
#include "control_lines.h"

#include <string.h>

void idl_control_init(idl_control_t *c, idl_control_say_fn say)
{
    memset(c, 0, sizeof *c);
    c->say = say;
}

/* `0x` hex digits or decimal digits, at most 24 characters, as device_sim/control.py _NUMBER;
 * 1 and *out when it is one of 0..65535 */
size_t idl_control_shown(const char *text)
{
    size_t n = strcspn(text, " \t\r");
    return n > 40u ? 40u : n;
}

static int number(const char *text, size_t n, uint16_t *out)
{
    size_t i = 0;
    unsigned long v = 0;
    unsigned base = 10u;
    if (n > 2u && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
        base = 16u;
        i = 2u;
    }
    if (n == 0u || n > 24u) {
        return 0;
    }
    for (; i < n; i++) {
        char ch = text[i];
        unsigned d = ch >= '0' && ch <= '9'   ? (unsigned)(ch - '0')
                     : ch >= 'a' && ch <= 'f' ? (unsigned)(ch - 'a') + 10u
                     : ch >= 'A' && ch <= 'F' ? (unsigned)(ch - 'A') + 10u
                                              : 16u;
        if (d >= base) {
            return 0;
        }
        v = v * base + d;
        if (v > 0xFFFFul) {
            return 0;
        }
    }
    *out = (uint16_t)v;
    return 1;
}

static int refuse(idl_control_t *c, const char *text, const char *why)
{
    if (c->say != NULL) {
        c->say(text, why);
    }
    c->refused++;
    return 0;
}

static int blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\r'; }

/* One line (NUL-terminated, no newline): 1 applied or ignored, 0 refused. */
static int apply_line(idl_control_t *c, const char *text, idl_regs_t *regs, uint32_t now)
{
    const char *word[4] = { NULL, NULL, NULL, NULL };
    size_t len[4] = { 0, 0, 0, 0 };
    unsigned count = 0;
    const char *p = text;
    uint16_t address;
    uint16_t value;
    int32_t at;
    int input;
    while (*p != '\0' && count < 4u) { /* up to four words: a fourth is one too many */
        while (blank(*p)) {
            p++;
        }
        if (*p == '\0') {
            break;
        }
        word[count] = p;
        while (*p != '\0' && !blank(*p)) {
            p++;
        }
        len[count] = (size_t)(p - word[count]);
        count++;
    }
    if (count == 0u || word[0][0] == '#') {
        return 1;
    }
    input = len[0] == 5u && strncmp(word[0], "input", 5u) == 0;
    if (!input && !(len[0] == 9u && strncmp(word[0], "condition", 9u) == 0)) {
        return refuse(c, text, "say 'input ADDRESS VALUE' or 'condition ADDRESS BITS'");
    }
    if (count != 3u) {
        return refuse(c, text, "takes an address and a value");
    }
    if (!number(word[1], len[1], &address)) {
        return refuse(c, text, "the address is not a number 0..65535");
    }
    if (!number(word[2], len[2], &value)) {
        return refuse(c, text, "the value is not a number 0..65535");
    }
    at = idl_regs_index(address);
    if (input) {
        if (at < 0 || IDL_REGMAP[at].kind != (uint8_t)IDL_REG_KIND_INPUT
            || !idl_regs_set_input(regs, address, value, now)) {
            return refuse(c, text, "not an INPUT register");
        }
        return 1;
    }
    if (at < 0 || IDL_REGMAP[at].kind != (uint8_t)IDL_REG_KIND_FAULT) {
        return refuse(c, text, "not a FAULT register");
    }
    if ((value & (uint16_t)~IDL_REGMAP[at].fault_mask) != 0u) {
        return refuse(c, text, "bits that are not declared fault bits");
    }
    c->external[at] = value;
    idl_regs_tick(regs, now); /* a condition that holds latches now */
    return 1;
}

unsigned idl_control_feed(idl_control_t *c, const char *data, size_t n, idl_regs_t *regs,
                          uint32_t now)
{
    unsigned refused = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        char ch = data[i];
        if (ch == '\n') {
            if (c->skipping) {
                c->skipping = 0;
                (void)refuse(c, "(too long)", "line longer than 128 bytes");
                refused++;
            } else if (c->nul) { /* not cut at the NUL: the simulator refuses such a word */
                c->line[c->used] = '\0';
                (void)refuse(c, c->line, "a NUL byte in the line");
                refused++;
            } else {
                c->line[c->used] = '\0';
                refused += apply_line(c, c->line, regs, now) ? 0u : 1u;
            }
            c->used = 0;
            c->nul = 0;
        } else if (!c->skipping) {
            if (c->used == IDL_CONTROL_MAX_LINE) {
                c->skipping = 1u; /* bounded: the rest of this line is dropped */
                c->used = 0;
            } else {
                c->nul |= (uint8_t)(ch == '\0');
                c->line[c->used++] = ch;
            }
        }
    }
    return refused;
}

uint16_t idl_control_conditions(const idl_control_t *c, uint16_t address)
{
    int32_t at = idl_regs_index(address);
    return at < 0 ? 0u : c->external[at];
}
