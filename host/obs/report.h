/* `meshrun report`: turns a --metrics file (and optionally a --trace file)
 * into one self-contained SVG (no scripts, fonts or links) with panels over
 * the steps for the loss, tokens/s per device and the share of each step
 * spent in communication, and with a trace, a per-device bar of compute,
 * communication and idle time. Reads files, writes one; no other state. */
#ifndef MESHRUN_REPORT_H
#define MESHRUN_REPORT_H

#include <stddef.h>

/* Reads metrics (JSON lines) and trace (Chrome trace-event JSON; NULL for
 * none) and writes the SVG to out, whole or not at all. Every plotted
 * point is a <circle> and every bar segment a <rect> carrying data-series
 * / data-step (or data-device) / data-value attributes with the value it
 * shows. Inputs are read in bounded memory: a metrics line longer than
 * 64 KiB (an input without newlines, such as /dev/zero), a metrics file
 * over 1 GiB or 4 Mi lines, a trace over 128 MiB are refused. A metrics
 * file whose last line lacks its newline and does not parse (its writer
 * was killed mid-line) is drawn without that line, and warn (may be NULL
 * with warnlen 0) says so; otherwise warn is empty.
 * 0, or -EBADMSG with err "report: FILE:LINE: what" when an input file is
 * missing, unreadable, malformed or too large, or another -errno when out
 * cannot be written. */
int report_write(const char *metrics, const char *trace, const char *out, char *warn,
		 size_t warnlen, char *err, size_t errlen);

#endif
