/* A hostfile as mpirun and DeepSpeed read it: one machine a line,
 *     [user@]host[:sshport] [slots=N]
 * with `#` comments and blank lines. slots, when given, must be 1 (one
 * agent per machine; its devices come from --devices-per-host). The line
 * order is the host id; host 0 is the coordinator. */
#ifndef MESHRUN_HOSTFILE_H
#define MESHRUN_HOSTFILE_H

#include <stddef.h>

#define HOSTFILE_MAX_HOSTS 256

struct hostfile_entry {
	char user[64];            /* "" : ssh's default */
	char host[192];           /* as written: a name or an address */
	int port;                 /* ssh port; 0: ssh's default */
	int line;                 /* line number in the file */
};

/* Parses text (NUL-terminated) read from a file named `name` (for
 * messages). 0 with *out (malloc'd) and *n >= 1, or -EBADMSG with
 * "name:line: what" in err (a bad line, a duplicate machine, an empty
 * file), -ENOMEM. */
int hostfile_parse(const char *name, const char *text, struct hostfile_entry **out, int *n,
		   char *err, size_t errlen);

/* Reads and parses the file at path: as hostfile_parse, or -errno when it
 * cannot be read. */
int hostfile_read(const char *path, struct hostfile_entry **out, int *n, char *err, size_t errlen);

#endif
