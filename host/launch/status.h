/* The status channel between an agent and the launcher that started it:
 * one line per event, written by the child, read by the launcher core
 * (host/launch/launch.c). A child finds its end in the environment
 * variable LAUNCH_STATUS_ENV (a file descriptor number); with the ssh
 * backend that descriptor is the remote agent's stderr, so the lines are
 * prefixed to stand apart from the agent's other messages. Lines:
 *
 *   meshrun-status: lost H    this child's net declared host H lost (died,
 *                             fell silent or broke its link)
 *   meshrun-status: loaded    this child has read its certificate files
 *
 * Unknown lines are passed through as text. Only macros here: agents and
 * launchers share the words, not code. */
#ifndef MESHRUN_LAUNCH_STATUS_H
#define MESHRUN_LAUNCH_STATUS_H

#define LAUNCH_STATUS_ENV "MESHRUN_STATUS_FD"
#define LAUNCH_STATUS_PREFIX "meshrun-status: "
#define LAUNCH_STATUS_LOST LAUNCH_STATUS_PREFIX "lost "
/* "meshrun-status: loaded": this child has read its certificates and
 * keys (it needs the files no more) */
#define LAUNCH_STATUS_LOADED LAUNCH_STATUS_PREFIX "loaded"

#endif
