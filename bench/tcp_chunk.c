/* What the kernel charges for loopback TCP, by the size of each send()
 * and recv(): one thread sends 1 GiB in chunks of CHUNK bytes, another
 * receives it in chunks of the same size; prints the process's CPU time
 * (user + system, both threads) per 16 MiB. No TLS. Tells whether
 * gathering TLS records into larger sends would pay (bench/results/transport.md).
 * build: cc -O2 -pthread -o /tmp/tcp_chunk bench/tcp_chunk.c
 * usage: /tmp/tcp_chunk CHUNK [CHUNK ...] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#define TOTAL (1ull << 30)

struct rx {
	int fd;
	size_t chunk;
};

static double cpu_s(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
	       (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static void *rx_main(void *arg)
{
	struct rx *a = arg;
	char *b = malloc(a->chunk);
	unsigned long long got = 0;
	while (b && got < TOTAL) {
		ssize_t n = recv(a->fd, b, a->chunk, 0);
		if (n <= 0)
			break;
		got += (unsigned long long)n;
	}
	free(b);
	return NULL;
}

static int one_run(size_t chunk)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sa);
	int ls = socket(AF_INET, SOCK_STREAM, 0);
	if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof(sa)) || listen(ls, 1) ||
	    getsockname(ls, (struct sockaddr *)&sa, &sl)) {
		perror("tcp_chunk: listen");
		return 1;
	}
	int tx = socket(AF_INET, SOCK_STREAM, 0);
	if (tx < 0 || connect(tx, (struct sockaddr *)&sa, sizeof(sa))) {
		perror("tcp_chunk: connect");
		return 1;
	}
	struct rx a = { .fd = accept(ls, NULL, NULL), .chunk = chunk };
	char *b = malloc(chunk);
	pthread_t t;
	if (a.fd < 0 || !b)
		return 1;
	memset(b, 1, chunk);
	double c0 = cpu_s();
	pthread_create(&t, NULL, rx_main, &a);
	unsigned long long sent = 0;
	while (sent < TOTAL) {
		ssize_t n = send(tx, b, chunk, 0);
		if (n <= 0)
			break;
		sent += (unsigned long long)n;
	}
	pthread_join(t, NULL);
	printf("chunk %zu: %.2f ms CPU per 16 MiB (send + recv)\n", chunk,
	       (cpu_s() - c0) * 1000.0 / (double)(TOTAL >> 24));
	free(b);
	close(tx);
	close(a.fd);
	close(ls);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: tcp_chunk CHUNK [CHUNK ...]\n");
		return 2;
	}
	for (int i = 1; i < argc; i++)
		if (one_run((size_t)atol(argv[i])))
			return 1;
	return 0;
}
