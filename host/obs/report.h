/* `meshrun report`: turns a --metrics file (and optionally a --trace file)
 * into one self-contained SVG (no scripts, fonts or links) with panels over
 * the steps for the loss, tokens/s per device and the share of each step
 * spent in communication, and with a trace, a per-device bar of compute,
 * communication and idle time. Reads files, writes one; no other state. */
#ifndef MESHRUN_REPORT_H
#define MESHRUN_REPORT_H

#include <stddef.h>

/* Reads metrics (JSON lines) and trace (Chrome trace-event JSON; NULL for
 * none) and writes the SVG to out. Every plotted point is a <circle> and
 * every bar segment a <rect> carrying data-series / data-step (or
 * data-device) / data-value attributes with the value it shows.
 * 0, or -EBADMSG with err "report: FILE:LINE: what" when an input file is
 * missing, unreadable or malformed, or another -errno when out cannot be
 * written. */
int report_write(const char *metrics, const char *trace, const char *out,
		 char *err, size_t errlen);

#endif
