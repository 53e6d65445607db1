/* Stream threads (net_int.h): each sleeps in epoll_wait on the sockets of
 * the data links given to it while they are UP, and calls the net's
 * stream callback (recv.c) with what epoll reported: the reading no device
 * thread is doing, and the writing the socket would not take at once.
 * Every socket is in its set with EPOLLONESHOT: after an event it stays
 * quiet until the link code arms it again (stream_arm), so a thread that
 * finds the link busy never spins on it. A link whose turn ended with
 * records left in OpenSSL's buffer (the callback returns true) goes on the
 * thread's list of links owed another turn, given round-robin after the
 * events of each poll, so no link holds the thread from the others.
 * While a link lingers (a device thread just stopped polling it, its
 * socket unarmed) the thread looks every LINGER_LOOK_MS; a linger that
 * begins while the thread sleeps with no timeout arms the thread's timer
 * (stream_linger), or nothing would read that link until the net
 * thread's tick, up to 50 ms later. Knows nothing of frames or TLS;
 * calls nothing in net/ but the callbacks. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "net/net_int.h"

#define STREAM_EVENTS 16

struct stream_thr {
	struct net *n;
	int index;
	pthread_t thread;
	int epfd, evfd;          /* evfd: stop */
	int tfd;                 /* the linger timer (stream_linger) */
	_Atomic bool asleep;     /* in epoll_wait with no timeout */
	_Atomic bool timer_set;  /* tfd armed and not yet read */
	bool started;
	struct link *again_head, *again_tail;   /* links owed another turn */
};

static void owe_turn(struct stream_thr *t, struct link *l)
{
	if (l->again_queued)
		return;
	l->again_queued = true;
	l->again_next = NULL;
	if (t->again_tail)
		t->again_tail->again_next = l;
	else
		t->again_head = l;
	t->again_tail = l;
}

static void *stream_main(void *arg)
{
	struct stream_thr *t = arg;
	struct epoll_event ev[STREAM_EVENTS];
	char name[16];
	snprintf(name, sizeof(name), "mr-stream%d", t->index);
	pthread_setname_np(pthread_self(), name);
	for (;;) {
		/* while a link lingers (a device thread just stopped polling
		 * it), look every LINGER_LOOK_MS whether its linger ran out */
		/* asleep is stored before lingering is read, as
		 * stream_linger raises lingering before it reads asleep: one
		 * of the two sees the other (sequentially consistent) */
		atomic_store(&t->asleep, true);
		bool linger = atomic_load(&t->n->lingering) > 0;
		if (t->again_head || linger)
			atomic_store(&t->asleep, false);
		int k = epoll_wait(t->epfd, ev, STREAM_EVENTS,
				   t->again_head ? 0 : linger ? LINGER_LOOK_MS : -1);
		atomic_store(&t->asleep, false);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return NULL;
		bool timer = false;
		for (int i = 0; i < k; i++)
			if (ev[i].data.ptr == t) {
				uint64_t expiries;   /* read to rearm the fd's readiness */
				(void)!read(t->tfd, &expiries, sizeof(expiries));
				atomic_store(&t->timer_set, false);
				timer = true;
			}
		if (linger || timer)
			t->n->stream_tick(t->n, t->index);
		for (int i = 0; i < k; i++) {
			if (!ev[i].data.ptr)
				return NULL;   /* stream_stop */
			if (ev[i].data.ptr == t)
				continue;      /* the linger timer, above */
			if (t->n->stream_cb(ev[i].data.ptr, ev[i].events))
				owe_turn(t, ev[i].data.ptr);
		}
		/* one turn each for the links owed one when this round began
		 * (data links live as long as the net, so the list cannot
		 * hold a freed one) */
		struct link *l = t->again_head;
		t->again_head = t->again_tail = NULL;
		while (l) {
			struct link *next = l->again_next;
			l->again_queued = false;
			l->again_next = NULL;
			if (t->n->stream_cb(l, STREAM_AGAIN))
				owe_turn(t, l);
			l = next;
		}
	}
}

int stream_start(struct net *n, int count, char *err, size_t errlen)
{
	n->streams = calloc((size_t)count, sizeof(*n->streams));
	if (!n->streams) {
		snprintf(err, errlen, "net: out of memory");
		return -ENOMEM;
	}
	n->nstreams = count;
	for (int i = 0; i < count; i++)
		n->streams[i].epfd = n->streams[i].evfd = n->streams[i].tfd = -1;
	for (int i = 0; i < count; i++) {
		struct stream_thr *t = &n->streams[i];
		t->n = n;
		t->index = i;
		t->epfd = epoll_create1(EPOLL_CLOEXEC);
		t->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
		t->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = NULL };
		struct epoll_event et = { .events = EPOLLIN, .data.ptr = t };
		if (t->epfd < 0 || t->evfd < 0 || t->tfd < 0 ||
		    epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->evfd, &e) ||
		    epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->tfd, &et) ||
		    pthread_create(&t->thread, NULL, stream_main, t)) {
			snprintf(err, errlen, "net: unable to start stream thread %d: %s", i,
				 strerror(errno));
			return -EAGAIN;
		}
		t->started = true;
	}
	return 0;
}

void stream_stop(struct net *n)
{
	for (int i = 0; i < n->nstreams; i++) {
		struct stream_thr *t = &n->streams[i];
		if (t->started) {
			uint64_t one = 1;
			if (write(t->evfd, &one, sizeof(one)) < 0)
				perror("meshrun: stream thread stop");
			pthread_join(t->thread, NULL);
		}
		if (t->epfd >= 0)
			close(t->epfd);
		if (t->evfd >= 0)
			close(t->evfd);
		if (t->tfd >= 0)
			close(t->tfd);
	}
	free(n->streams);
	n->streams = NULL;
	n->nstreams = 0;
}

static int stream_epfd(const struct link *l)
{
	const struct net *n = l->net;
	return n->streams[l->stream % n->nstreams].epfd;
}

int stream_add(struct link *l)
{
	struct epoll_event e = { .events = EPOLLONESHOT, .data.ptr = l };
	if (epoll_ctl(stream_epfd(l), EPOLL_CTL_ADD, l->c->fd, &e))
		return -errno;
	l->watched = true;
	l->armed = 0;
	return 0;
}

void stream_arm(struct link *l, uint32_t events)
{
	struct epoll_event e = { .events = events | EPOLLONESHOT, .data.ptr = l };
	if (!epoll_ctl(stream_epfd(l), EPOLL_CTL_MOD, l->c->fd, &e))
		l->armed = events;
}

void stream_linger(struct link *l)
{
	if (!l->net->nstreams)
		return;
	struct stream_thr *t = &l->net->streams[l->stream % l->net->nstreams];
	if (!atomic_load(&t->asleep) || atomic_exchange(&t->timer_set, true))
		return;
	/* one shot, at the thread's next look */
	struct itimerspec when = { .it_value = { .tv_nsec = LINGER_LOOK_MS * 1000 * 1000 } };
	if (timerfd_settime(t->tfd, 0, &when, NULL))
		atomic_store(&t->timer_set, false);
}

void stream_del(struct link *l)
{
	if (!l->watched)
		return;
	epoll_ctl(stream_epfd(l), EPOLL_CTL_DEL, l->c->fd, NULL);
	l->watched = false;
	l->armed = 0;
}
