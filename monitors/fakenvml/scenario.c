/*
 * scenario.c: the scenario file parser of the fake NVML library.
 *
 * The same code runs in libnvidia-ml.so.1 and, through cgo, in the Go
 * package (for table tests and fuzzing). It never trusts its input: every
 * line, key and value has a fixed maximum length, numbers are range checked
 * before any arithmetic, and a bad line is rejected as a whole.
 *
 * Format (one directive per line, '#' starts a comment, blank lines are
 * ignored, values may be "double quoted" and then hold spaces and '#'):
 *
 *   device [index=N] [uuid=GPU-...] [pci=DDDD:BB:DD.F] [name="..."] [links=0..36]
 *          [vbios=V] [inforom=V] [ecc=on|off|none] [persistence=on|off|none]
 *          [mig=on|off|none] [power=W]
 *   system [driver=V] [cuda=N]
 *   xid       device=N code=C [at=T]
 *   lost      device=N [at=T]
 *   nvlink    device=N link=L counter=K rate=R [from=T] [for=D]
 *   nvlink    device=N link=L counter=K value=V [at=T]
 *   linkstate device=N link=L state=up|down [at=T]
 *   fabric    device=N [state=S] [health=H] [status=E] [clique=Q] [mask=M] [cluster=X] [at=T]
 *   clocks    device=N [reasons=R] [sm=MHZ] [sm_max=MHZ] [at=T]
 *   pcie      device=N [gen=G] [width=W] [max_gen=G] [max_width=W] [gpu_max_gen=G] [at=T]
 *   pcireplay device=N rate=R [from=T] [for=D]  |  value=V [at=T]
 *   util      device=N [gpu=P] [memory=P] [at=T]
 *   remap     device=N [corr=C] [uncorr=U] [pending=B] [failure=B] [at=T]
 *   retired   device=N pending=B [at=T]
 *   ecc       device=N rate=R [from=T] [for=D]  |  value=V [at=T]
 *   temp      device=N [gpu=C] [slowdown=C] [shutdown=C] [at=T]
 *   nvlinkspeed device=N link=L mbps=M [at=T]
 *
 * T is a Go duration after nvmlInit (500ms, 2s, 1m30s) or @<unix seconds>
 * (fractions allowed); at= and from= are the same key. D is a Go duration.
 * K is replay, recovery, crc_flit, crc_data, ecc_data or 0..4. R for clocks
 * is a comma-separated list of reason names, none, or a number; B is yes,
 * no, true, false, 1 or 0.
 */
#include "scenario.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KEYS 16
#define MAX_KEY 16
#define MAX_VALUE 128
#define MAX_REL_NS (100000LL * 3600 * 1000000000LL) /* 100000 h */
#define MAX_ABS_SEC 4000000000LL /* year 2096: abs + rel stays far below INT64_MAX */
#define MAX_RATE 1e12            /* errors per second */

struct kv {
	char key[MAX_KEY];
	char val[MAX_VALUE];
	int used;
};

struct line {
	char word[MAX_KEY];
	struct kv kv[MAX_KEYS];
	int n;
	char err[160];
};

static const char *const counter_names[FAKE_NUM_COUNTERS] = {
	"replay", "recovery", "crc_flit", "crc_data", "ecc_data",
};
static const char *const fabric_states[] = {"not_supported", "not_started", "in_progress", "completed"};
static const char *const fabric_health[] = {"not_supported", "healthy", "unhealthy", "limited_capacity"};
/* nvmlClocksEventReason* bits, bit i named reason_names[i]. */
static const char *const reason_names[] = {
	"gpu_idle", "app_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
	"hw_thermal", "hw_power_brake", "display_clock", "board_limit", "reliability",
};
#define NUM_REASONS ((int)(sizeof(reason_names) / sizeof(reason_names[0])))

static int fail(struct line *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct line *l, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(l->err, sizeof(l->err), fmt, ap);
	va_end(ap);
	return -1;
}

static int is_space(char c) { return c == ' ' || c == '\t'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static int hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* tokenize splits a line into its directive word and key=value pairs. */
static int tokenize(const char *p, size_t n, struct line *l)
{
	size_t i = 0, start;

	while (i < n && is_space(p[i]))
		i++;
	if (i == n || p[i] == '#')
		return 0; /* blank or comment: no word */
	start = i;
	while (i < n && p[i] >= 'a' && p[i] <= 'z')
		i++;
	if (i == start || i - start >= MAX_KEY || (i < n && !is_space(p[i]) && p[i] != '#'))
		return fail(l, "unknown directive");
	memcpy(l->word, p + start, i - start);
	l->word[i - start] = '\0';

	for (;;) {
		struct kv *kv;
		size_t klen, vlen;
		int k;

		while (i < n && is_space(p[i]))
			i++;
		if (i == n || p[i] == '#')
			return 0;
		if (l->n == MAX_KEYS)
			return fail(l, "more than %d keys", MAX_KEYS);
		kv = &l->kv[l->n];
		start = i;
		while (i < n && ((p[i] >= 'a' && p[i] <= 'z') || p[i] == '_'))
			i++;
		klen = i - start;
		if (klen == 0 || i == n || p[i] != '=')
			return fail(l, "want key=value after %s", l->n ? l->kv[l->n - 1].key : l->word);
		if (klen >= MAX_KEY)
			return fail(l, "key too long");
		memcpy(kv->key, p + start, klen);
		kv->key[klen] = '\0';
		i++; /* '=' */
		if (i < n && p[i] == '"') {
			const char *q = memchr(p + i + 1, '"', n - i - 1);

			if (q == NULL)
				return fail(l, "unterminated quote in %s=", kv->key);
			start = i + 1;
			vlen = (size_t)(q - p) - start;
			i = (size_t)(q - p) + 1;
			if (i < n && !is_space(p[i]) && p[i] != '#')
				return fail(l, "text after the closing quote of %s=", kv->key);
		} else {
			start = i;
			while (i < n && !is_space(p[i]) && p[i] != '#' && p[i] != '"')
				i++;
			if (i < n && p[i] == '"')
				return fail(l, "stray quote in %s=", kv->key);
			vlen = i - start;
		}
		if (vlen >= MAX_VALUE)
			return fail(l, "value of %s= longer than %d bytes", kv->key, MAX_VALUE - 1);
		memcpy(kv->val, p + start, vlen);
		kv->val[vlen] = '\0';
		for (k = 0; k < l->n; k++)
			if (strcmp(l->kv[k].key, kv->key) == 0)
				return fail(l, "duplicate key %s=", kv->key);
		l->n++;
	}
}

/* take returns the value of key and marks it used, or NULL when absent. */
static const char *take(struct line *l, const char *key)
{
	int k;

	for (k = 0; k < l->n; k++) {
		if (strcmp(l->kv[k].key, key) == 0) {
			l->kv[k].used = 1;
			return l->kv[k].val;
		}
	}
	return NULL;
}

static int parse_uint(const char *v, uint64_t max, uint64_t *out)
{
	uint64_t x = 0;

	if (*v == '\0')
		return -1;
	for (; *v; v++) {
		if (!is_digit(*v) || x > (UINT64_MAX - (uint64_t)(*v - '0')) / 10)
			return -1;
		x = x * 10 + (uint64_t)(*v - '0');
	}
	if (x > max)
		return -1;
	*out = x;
	return 0;
}

/* parse_number reads digits[.digits] from *v (advancing it) as a double. */
static int parse_number(const char **v, double *out)
{
	const char *p = *v;
	double x = 0, scale = 1;
	int digits = 0;

	for (; is_digit(*p); p++, digits++)
		if (digits < 20) /* more digits than this are out of range anyway */
			x = x * 10 + (*p - '0');
	if (digits > 19)
		return -1;
	if (*p == '.') {
		for (p++; is_digit(*p); p++, digits++) {
			scale /= 10;
			x += (*p - '0') * scale;
		}
	}
	if (digits == 0)
		return -1;
	*v = p;
	*out = x;
	return 0;
}

/* parse_duration reads a Go-style duration: 0, 1.5s, 2m30s, 100ms, 10us. */
static int parse_duration(const char *v, int64_t *ns)
{
	static const struct {
		const char *name;
		double ns;
	} units[] = {
		{"ns", 1}, {"us", 1e3}, {"\xc2\xb5s", 1e3}, {"\xce\xbcs", 1e3},
		{"ms", 1e6}, {"s", 1e9}, {"m", 60e9}, {"h", 3600e9},
	};
	double total = 0;

	if (strcmp(v, "0") == 0) {
		*ns = 0;
		return 0;
	}
	if (*v == '\0')
		return -1;
	while (*v) {
		double x;
		size_t u, best = 0, bestlen = 0;

		if (parse_number(&v, &x) != 0)
			return -1;
		for (u = 0; u < sizeof(units) / sizeof(units[0]); u++) {
			size_t len = strlen(units[u].name);

			if (strncmp(v, units[u].name, len) == 0 && len > bestlen) {
				best = u;
				bestlen = len;
			}
		}
		if (bestlen == 0)
			return -1;
		v += bestlen;
		total += x * units[best].ns;
		if (total > (double)MAX_REL_NS)
			return -1;
	}
	*ns = (int64_t)(total + 0.5);
	return 0;
}

/* parse_time reads a duration after nvmlInit or @<unix seconds[.fraction]>. */
static int parse_time(const char *v, struct fake_time *t)
{
	int64_t sec = 0, frac = 0, scale = 100000000;
	int digits = 0;

	if (*v != '@') {
		t->absolute = 0;
		return parse_duration(v, &t->ns);
	}
	for (v++; is_digit(*v); v++) {
		if (++digits > 10)
			return -1;
		sec = sec * 10 + (*v - '0');
	}
	if (digits == 0 || sec > MAX_ABS_SEC)
		return -1;
	if (*v == '.') {
		for (v++; is_digit(*v); v++) {
			frac += (*v - '0') * scale; /* digits past the 9th add 0 */
			scale /= 10;
		}
	}
	if (*v != '\0')
		return -1;
	t->absolute = 1;
	t->ns = sec * 1000000000LL + frac;
	return 0;
}

static int parse_name(const char *v, const char *const *names, int n, uint64_t *out)
{
	int i;

	for (i = 0; i < n; i++) {
		if (strcmp(v, names[i]) == 0) {
			*out = (uint64_t)i;
			return 0;
		}
	}
	return parse_uint(v, (uint64_t)n - 1, out);
}

/* parse_cluster reads 32 hex digits (dashes ignored) or up to 16 bytes of text. */
static int parse_cluster(const char *v, unsigned char out[FAKE_CLUSTER_LEN])
{
	unsigned char b[FAKE_CLUSTER_LEN] = {0};
	size_t digits = 0, len = strlen(v);
	const char *p;

	for (p = v; *p; p++) {
		if (*p == '-')
			continue;
		if (hex_value(*p) < 0 || digits == 2 * FAKE_CLUSTER_LEN) {
			digits = 0;
			break;
		}
		b[digits / 2] = (unsigned char)(b[digits / 2] << 4 | hex_value(*p));
		digits++;
	}
	memset(out, 0, FAKE_CLUSTER_LEN);
	if (digits == 2 * FAKE_CLUSTER_LEN) {
		memcpy(out, b, FAKE_CLUSTER_LEN);
		return 0;
	}
	if (len > FAKE_CLUSTER_LEN)
		return -1;
	memcpy(out, v, len);
	return 0;
}

int fake_parse_pci(const char *p, size_t n, unsigned *domain, unsigned *bus, unsigned *dev,
		   unsigned *function)
{
	unsigned long f[3] = {0};
	size_t nf = 0, i = 0;
	unsigned fn = 0;

	for (;;) {
		unsigned long v = 0;
		int digits = 0;

		while (i < n && hex_value(p[i]) >= 0) {
			if (++digits > 8)
				return -1;
			v = v * 16 + (unsigned long)hex_value(p[i++]);
		}
		if (digits == 0 || nf == 3)
			return -1;
		f[nf++] = v;
		if (i < n && p[i] == ':') {
			i++;
			continue;
		}
		break;
	}
	if (i < n && p[i] == '.') {
		if (i + 1 >= n || p[i + 1] < '0' || p[i + 1] > '7')
			return -1;
		fn = (unsigned)(p[i + 1] - '0');
		i += 2;
	}
	if (i != n || nf < 2)
		return -1;
	if (nf == 2) {
		f[2] = f[1];
		f[1] = f[0];
		f[0] = 0;
	}
	if (f[1] > 0xff || f[2] > 0x1f)
		return -1;
	*domain = (unsigned)f[0];
	*bus = (unsigned)f[1];
	*dev = (unsigned)f[2];
	*function = fn;
	return 0;
}

/* take_version copies key's value, when present, into dst (FAKE_VERSION_SIZE). */
static int take_version(struct line *l, const char *key, char *dst)
{
	const char *v = take(l, key);

	if (v == NULL)
		return 0;
	if (*v == '\0' || strlen(v) >= FAKE_VERSION_SIZE)
		return fail(l, "%s= must be 1 to %d bytes", key, FAKE_VERSION_SIZE - 1);
	strcpy(dst, v);
	return 0;
}

/* take_mode reads key=on|off|none into 1, 0 or -1 (not supported). */
static int take_mode(struct line *l, const char *key, int *mode)
{
	const char *v = take(l, key);

	if (v == NULL)
		return 0;
	if (strcmp(v, "on") == 0)
		*mode = 1;
	else if (strcmp(v, "off") == 0)
		*mode = 0;
	else if (strcmp(v, "none") == 0)
		*mode = -1;
	else
		return fail(l, "%s=%.20s: want on, off or none", key, v);
	return 0;
}

/* parse_system_line reads the driver's version and CUDA version. */
static int parse_system_line(struct fake_scenario *s, struct line *l)
{
	const char *v;
	uint64_t x;
	int i;

	if (s->live)
		return fail(l, "system lines are not accepted after nvmlInit");
	if ((v = take(l, "driver")) != NULL) {
		if (*v == '\0' || strlen(v) >= FAKE_DRIVER_SIZE)
			return fail(l, "driver= must be 1 to %d bytes", FAKE_DRIVER_SIZE - 1);
		strcpy(s->driver, v);
	}
	if ((v = take(l, "cuda")) != NULL) {
		if (parse_uint(v, 999999, &x) != 0 || x == 0)
			return fail(l, "cuda=%.20s: want NVML's number, 1000*major+10*minor (12080)", v);
		s->cuda = (unsigned)x;
	}
	for (i = 0; i < l->n; i++)
		if (!l->kv[i].used)
			return fail(l, "unexpected key %s= for system", l->kv[i].key);
	return 0;
}

static int parse_device_line(struct fake_scenario *s, struct line *l)
{
	struct fake_device d;
	const char *v;
	uint64_t x;
	int i;

	memset(&d, 0, sizeof(d));
	if (s->live)
		return fail(l, "device lines are not accepted after nvmlInit");
	if (s->ndevices == FAKE_MAX_DEVICES)
		return fail(l, "more than %d devices", FAKE_MAX_DEVICES);
	if ((v = take(l, "index")) != NULL &&
	    (parse_uint(v, FAKE_MAX_DEVICES, &x) != 0 || x != (uint64_t)s->ndevices))
		return fail(l, "index=%.20s: devices must be numbered 0, 1, ... in order (want %d)", v,
			    s->ndevices);
	snprintf(d.uuid, sizeof(d.uuid), "GPU-00000000-0000-0000-0000-0000000000%02x", s->ndevices);
	if ((v = take(l, "uuid")) != NULL) {
		if (*v == '\0' || strlen(v) >= FAKE_UUID_SIZE)
			return fail(l, "uuid= must be 1 to %d bytes", FAKE_UUID_SIZE - 1);
		strcpy(d.uuid, v);
	}
	d.bus = (unsigned)s->ndevices + 1;
	if ((v = take(l, "pci")) != NULL &&
	    fake_parse_pci(v, strlen(v), &d.domain, &d.bus, &d.dev, &d.function) != 0)
		return fail(l, "pci=%.40s: want [domain:]bus:device[.function] in hex", v);
	strcpy(d.name, "fakenvml GPU");
	if ((v = take(l, "name")) != NULL) {
		if (strlen(v) >= FAKE_NAME_SIZE)
			return fail(l, "name= longer than %d bytes", FAKE_NAME_SIZE - 1);
		strcpy(d.name, v);
	}
	d.links = 18;
	if ((v = take(l, "links")) != NULL) {
		if (parse_uint(v, FAKE_MAX_LINKS, &x) != 0)
			return fail(l, "links=%.20s: want 0 to %d", v, FAKE_MAX_LINKS);
		d.links = (unsigned)x;
	}
	strcpy(d.vbios, "96.00.74.00.01");
	strcpy(d.inforom, "G520.0200.00.05");
	if (take_version(l, "vbios", d.vbios) != 0 || take_version(l, "inforom", d.inforom) != 0)
		return -1;
	d.ecc = 1;
	d.persistence = 1;
	d.mig = 0;
	if (take_mode(l, "ecc", &d.ecc) != 0 || take_mode(l, "persistence", &d.persistence) != 0 ||
	    take_mode(l, "mig", &d.mig) != 0)
		return -1;
	d.power_w = 700;
	if ((v = take(l, "power")) != NULL) {
		if (parse_uint(v, 100000, &x) != 0)
			return fail(l, "power=%.20s: want watts, 0 to 100000", v);
		d.power_w = (unsigned)x;
	}
	for (i = 0; i < s->ndevices; i++) {
		const struct fake_device *o = &s->devices[i];

		if (strcmp(o->uuid, d.uuid) == 0)
			return fail(l, "device %d already has uuid %s", i, d.uuid);
		if (o->domain == d.domain && o->bus == d.bus && o->dev == d.dev && o->function == d.function)
			return fail(l, "device %d already has that pci address", i);
	}
	for (i = 0; i < l->n; i++)
		if (!l->kv[i].used)
			return fail(l, "unexpected key %s= for device", l->kv[i].key);
	s->devices[s->ndevices++] = d;
	return 0;
}

/* take_device reads device= (required) and, if want_link, link= (required). */
static int take_device(const struct fake_scenario *s, struct line *l, struct fake_op *op, int want_link)
{
	const char *v = take(l, "device");
	uint64_t x;

	if (v == NULL)
		return fail(l, "missing device=");
	if (parse_uint(v, FAKE_MAX_DEVICES, &x) != 0 || x >= (uint64_t)s->ndevices)
		return fail(l, "device=%.20s: no such device (%d declared)", v, s->ndevices);
	op->device = (int)x;
	if (!want_link)
		return 0;
	if ((v = take(l, "link")) == NULL)
		return fail(l, "missing link=");
	if (parse_uint(v, FAKE_MAX_LINKS, &x) != 0 || x >= s->devices[op->device].links)
		return fail(l, "link=%.20s: device %d has %u links", v, op->device,
			    s->devices[op->device].links);
	op->link = (int)x;
	return 0;
}

/* take_time reads at= or its alias from= (default: nvmlInit time). */
static int take_time(struct line *l, struct fake_op *op)
{
	const char *at = take(l, "at"), *from = take(l, "from");

	if (at != NULL && from != NULL)
		return fail(l, "at= and from= are the same key; give one");
	if (at == NULL)
		at = from;
	if (at != NULL && parse_time(at, &op->at) != 0)
		return fail(l, "time %.40s: want a duration (2s, 500ms) or @<unix seconds>", at);
	return 0;
}

/* take_counter reads a counter's rate= (with for=) or value=, exactly one. */
static int take_counter(struct line *l, struct fake_op *op)
{
	const char *v, *rate = take(l, "rate"), *value = take(l, "value");

	if ((rate == NULL) == (value == NULL))
		return fail(l, "%s needs exactly one of rate= and value=", l->word);
	if (value != NULL) {
		op->kind = FAKE_OP_COUNTER_SET;
		if (parse_uint(value, UINT64_MAX, &op->value) != 0)
			return fail(l, "value=%.24s: want a non-negative integer", value);
		return 0;
	}
	op->kind = FAKE_OP_COUNTER_RAMP;
	if (parse_number(&rate, &op->rate) != 0 || *rate != '\0' || op->rate > MAX_RATE)
		return fail(l, "rate: want a non-negative number per second");
	if ((v = take(l, "for")) != NULL && parse_duration(v, &op->for_ns) != 0)
		return fail(l, "for=%.40s: want a duration", v);
	return 0;
}

/* take_num reads key=N (0 to max), or def when absent. Looking a key up
 * again finds it already taken, which is fine: take marks, never removes. */
static int take_num(struct line *l, const char *key, uint64_t max, uint32_t def, uint32_t *out)
{
	const char *v = take(l, key);
	uint64_t x;

	*out = def;
	if (v == NULL)
		return 0;
	if (parse_uint(v, max, &x) != 0)
		return fail(l, "%s=%.24s: want an integer from 0 to %llu", key, v, (unsigned long long)max);
	*out = (uint32_t)x;
	return 0;
}

/* take_bool reads key=yes|no|true|false|1|0 into 1 or 0; absent leaves *out. */
static int take_bool(struct line *l, const char *key, uint32_t *out)
{
	const char *v = take(l, key);

	if (v == NULL)
		return 0;
	if (strcmp(v, "yes") == 0 || strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
		*out = 1;
	else if (strcmp(v, "no") == 0 || strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
		*out = 0;
	else
		return fail(l, "%s=%.20s: want yes, no, true, false, 1 or 0", key, v);
	return 0;
}

/* take_reasons reads reasons=: none, a number, or names joined by commas. */
static int take_reasons(struct line *l, uint64_t *out)
{
	const char *v = take(l, "reasons"), *p;

	*out = 0;
	if (v == NULL || strcmp(v, "none") == 0)
		return 0;
	if (is_digit(*v)) {
		if (parse_uint(v, UINT32_MAX, out) != 0)
			return fail(l, "reasons=%.24s: want a 32-bit number", v);
		return 0;
	}
	for (p = v; *p;) {
		const char *end = strchr(p, ',');
		size_t n = end != NULL ? (size_t)(end - p) : strlen(p);
		int i;

		for (i = 0; i < NUM_REASONS; i++)
			if (strlen(reason_names[i]) == n && strncmp(p, reason_names[i], n) == 0)
				break;
		if (i == NUM_REASONS)
			return fail(l, "reasons=: unknown reason %.*s (want none, a number or names such as hw_slowdown,sw_thermal)",
				    (int)(n > 24 ? 24 : n), p);
		*out |= 1ULL << i;
		p += n;
		if (*p == ',' && *++p == '\0')
			return fail(l, "reasons=: trailing comma");
	}
	return 0;
}

static int parse_op_line(struct fake_scenario *s, struct line *l, struct fake_op *op)
{
	const char *v;
	uint64_t x;

	op->for_ns = -1;
	if (strcmp(l->word, "xid") == 0) {
		op->kind = FAKE_OP_XID;
		if (take_device(s, l, op, 0) != 0)
			return -1;
		if ((v = take(l, "code")) == NULL)
			return fail(l, "missing code=");
		if (parse_uint(v, UINT32_MAX, &op->value) != 0)
			return fail(l, "code=%.20s: want an XID number", v);
	} else if (strcmp(l->word, "lost") == 0) {
		op->kind = FAKE_OP_LOST;
		if (take_device(s, l, op, 0) != 0)
			return -1;
	} else if (strcmp(l->word, "nvlink") == 0) {
		if (take_device(s, l, op, 1) != 0)
			return -1;
		if ((v = take(l, "counter")) == NULL)
			return fail(l, "missing counter=");
		if (parse_name(v, counter_names, FAKE_NUM_COUNTERS, &x) != 0)
			return fail(l, "counter=%.20s: want replay, recovery, crc_flit, crc_data, ecc_data or 0-4", v);
		op->counter = (int)x;
		if (take_counter(l, op) != 0)
			return -1;
	} else if (strcmp(l->word, "pcireplay") == 0 || strcmp(l->word, "ecc") == 0) {
		if (take_device(s, l, op, 0) != 0)
			return -1;
		op->link = l->word[0] == 'p' ? FAKE_LINK_PCIE_REPLAY : FAKE_LINK_ECC;
		if (take_counter(l, op) != 0)
			return -1;
	} else if (strcmp(l->word, "clocks") == 0) {
		op->kind = FAKE_OP_CLOCKS;
		if (take_device(s, l, op, 0) != 0 || take_reasons(l, &op->value) != 0 ||
		    take_num(l, "sm", 100000, 1980, &op->num[FAKE_SM]) != 0 ||
		    take_num(l, "sm_max", 100000, 1980, &op->num[FAKE_SM_MAX]) != 0)
			return -1;
	} else if (strcmp(l->word, "pcie") == 0) {
		op->kind = FAKE_OP_PCIE;
		if (take_device(s, l, op, 0) != 0 || take_num(l, "gen", 16, 5, &op->num[FAKE_GEN]) != 0 ||
		    take_num(l, "width", 64, 16, &op->num[FAKE_WIDTH]) != 0 ||
		    take_num(l, "max_gen", 16, 5, &op->num[FAKE_MAX_GEN]) != 0 ||
		    take_num(l, "max_width", 64, 16, &op->num[FAKE_MAX_WIDTH]) != 0 ||
		    take_num(l, "gpu_max_gen", 16, 5, &op->num[FAKE_GPU_MAX_GEN]) != 0)
			return -1;
	} else if (strcmp(l->word, "util") == 0) {
		op->kind = FAKE_OP_UTIL;
		if (take_device(s, l, op, 0) != 0 || take_num(l, "gpu", 100, 0, &op->num[FAKE_UTIL_GPU]) != 0 ||
		    take_num(l, "memory", 100, 0, &op->num[FAKE_UTIL_MEMORY]) != 0)
			return -1;
	} else if (strcmp(l->word, "remap") == 0) {
		op->kind = FAKE_OP_REMAP;
		if (take_device(s, l, op, 0) != 0 || take_num(l, "corr", UINT32_MAX, 0, &op->num[FAKE_CORR]) != 0 ||
		    take_num(l, "uncorr", UINT32_MAX, 0, &op->num[FAKE_UNCORR]) != 0 ||
		    take_bool(l, "pending", &op->num[FAKE_PENDING]) != 0 ||
		    take_bool(l, "failure", &op->num[FAKE_FAILURE]) != 0)
			return -1;
	} else if (strcmp(l->word, "retired") == 0) {
		uint32_t pending = 2;

		op->kind = FAKE_OP_RETIRED;
		if (take_device(s, l, op, 0) != 0 || take_bool(l, "pending", &pending) != 0)
			return -1;
		if (pending == 2)
			return fail(l, "missing pending=");
		op->state = (int)pending;
	} else if (strcmp(l->word, "temp") == 0) {
		op->kind = FAKE_OP_TEMP;
		if (take_device(s, l, op, 0) != 0 || take_num(l, "gpu", 200, 40, &op->num[FAKE_TEMP_GPU]) != 0 ||
		    take_num(l, "slowdown", 200, 90, &op->num[FAKE_SLOWDOWN]) != 0 ||
		    take_num(l, "shutdown", 200, 95, &op->num[FAKE_SHUTDOWN]) != 0)
			return -1;
	} else if (strcmp(l->word, "nvlinkspeed") == 0) {
		op->kind = FAKE_OP_NVLINK_SPEED;
		if (take_device(s, l, op, 1) != 0)
			return -1;
		if (take(l, "mbps") == NULL)
			return fail(l, "missing mbps=");
		if (take_num(l, "mbps", UINT32_MAX, 0, &op->num[FAKE_MBPS]) != 0)
			return -1;
	} else if (strcmp(l->word, "linkstate") == 0) {
		op->kind = FAKE_OP_LINKSTATE;
		if (take_device(s, l, op, 1) != 0)
			return -1;
		if ((v = take(l, "state")) == NULL)
			return fail(l, "missing state=");
		if (strcmp(v, "up") != 0 && strcmp(v, "down") != 0)
			return fail(l, "state=%.20s: want up or down", v);
		op->state = strcmp(v, "up") == 0;
	} else if (strcmp(l->word, "fabric") == 0) {
		op->kind = FAKE_OP_FABRIC;
		if (take_device(s, l, op, 0) != 0)
			return -1;
		op->state = 3;
		op->health = 1;
		if ((v = take(l, "state")) != NULL) {
			if (parse_name(v, fabric_states, 4, &x) != 0)
				return fail(l, "state=%.20s: want not_supported, not_started, in_progress, completed or 0-3", v);
			op->state = (int)x;
		}
		if ((v = take(l, "health")) != NULL) {
			if (parse_name(v, fabric_health, 4, &x) != 0)
				return fail(l, "health=%.20s: want not_supported, healthy, unhealthy, limited_capacity or 0-3", v);
			op->health = (int)x;
		}
		if ((v = take(l, "status")) != NULL) {
			if (strcmp(v, "success") == 0)
				x = 0;
			else if (parse_uint(v, UINT32_MAX, &x) != 0)
				return fail(l, "status=%.20s: want success or an NVML return code", v);
			op->status = (uint32_t)x;
		}
		if ((v = take(l, "clique")) != NULL) {
			if (parse_uint(v, UINT32_MAX, &x) != 0)
				return fail(l, "clique=%.20s: want a 32-bit number", v);
			op->clique = (uint32_t)x;
		}
		if ((v = take(l, "mask")) != NULL) {
			if (parse_uint(v, UINT32_MAX, &x) != 0)
				return fail(l, "mask=%.20s: want a 32-bit number", v);
			op->mask = (uint32_t)x;
		}
		if ((v = take(l, "cluster")) != NULL && parse_cluster(v, op->cluster) != 0)
			return fail(l, "cluster=: want 32 hex digits or at most %d bytes of text", FAKE_CLUSTER_LEN);
	} else {
		return fail(l, "unknown directive %s", l->word);
	}
	return take_time(l, op);
}

static int known_directive(const char *word)
{
	static const char *const known[] = {"device", "system", "xid", "lost", "nvlink", "linkstate", "fabric",
					    "clocks", "pcie", "pcireplay", "util", "remap", "retired",
					    "ecc", "temp", "nvlinkspeed"};
	size_t i;

	for (i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strcmp(word, known[i]) == 0)
			return 1;
	return 0;
}

static int parse_line(struct fake_scenario *s, const char *p, size_t n, struct line *l)
{
	struct fake_op op, *dst;
	int i;

	if (n > 0 && p[n - 1] == '\r')
		n--;
	if (n > FAKE_MAX_LINE)
		return fail(l, "line longer than %d bytes", FAKE_MAX_LINE);
	if (memchr(p, '\0', n) != NULL)
		return fail(l, "line holds a NUL byte");
	if (tokenize(p, n, l) != 0) {
		if (l->word[0] != '\0' && !known_directive(l->word))
			return fail(l, "unknown directive %s", l->word);
		return -1;
	}
	if (l->word[0] == '\0')
		return 1; /* blank or comment */
	if (strcmp(l->word, "device") == 0)
		return parse_device_line(s, l);
	if (strcmp(l->word, "system") == 0)
		return parse_system_line(s, l);
	memset(&op, 0, sizeof(op));
	if (parse_op_line(s, l, &op) != 0)
		return -1;
	for (i = 0; i < l->n; i++)
		if (!l->kv[i].used)
			return fail(l, "unexpected key %s= for %s", l->kv[i].key, l->word);
	if ((dst = fake_add_op(s)) == NULL)
		return fail(l, "more than %d directives", FAKE_MAX_OPS);
	*dst = op;
	return 0;
}

static void finish_line(struct fake_scenario *s, const char *p, size_t n)
{
	struct line l;
	int rc;

	memset(&l, 0, sizeof(l));
	s->lineno++;
	if (s->skipping) {
		s->skipping = 0;
		rc = fail(&l, "line longer than %d bytes", FAKE_MAX_LINE);
	} else {
		rc = parse_line(s, p, n, &l);
	}
	if (rc == 0) {
		s->directives++;
	} else if (rc < 0) {
		s->errors++;
		if (s->first_error[0] == '\0')
			snprintf(s->first_error, sizeof(s->first_error), "line %ld: %s", s->lineno, l.err);
		if (s->log)
			fprintf(stderr, "fakenvml: scenario line %ld skipped: %s (%ld bad lines so far)\n",
				s->lineno, l.err, s->errors);
	}
}

size_t fake_parse(struct fake_scenario *s, const char *buf, size_t len, int final)
{
	size_t pos = 0;

	while (pos < len) {
		const char *nl = memchr(buf + pos, '\n', len - pos);
		size_t end = nl != NULL ? (size_t)(nl - buf) : len;

		if (nl == NULL && !final) {
			/* An unfinished line: wait for its newline, unless it is
			 * already too long, then drop its bytes and remember. */
			if (len - pos > FAKE_MAX_LINE + 1) {
				s->skipping = 1;
				pos = len;
			}
			break;
		}
		finish_line(s, buf + pos, end - pos);
		pos = nl != NULL ? end + 1 : len;
	}
	if (final && s->skipping)
		finish_line(s, buf, 0);
	return pos;
}

struct fake_op *fake_add_op(struct fake_scenario *s)
{
	if (s->nops == s->capops) {
		size_t cap = s->capops ? 2 * s->capops : 64;
		struct fake_op *ops;

		if (s->nops >= FAKE_MAX_OPS)
			return NULL;
		if (cap > FAKE_MAX_OPS)
			cap = FAKE_MAX_OPS;
		ops = realloc(s->ops, cap * sizeof(*ops));
		if (ops == NULL)
			return NULL;
		s->ops = ops;
		s->capops = cap;
	}
	memset(&s->ops[s->nops], 0, sizeof(s->ops[0]));
	return &s->ops[s->nops++];
}

void fake_scenario_init(struct fake_scenario *s)
{
	memset(s, 0, sizeof(*s));
	strcpy(s->driver, "570.133.20");
	s->cuda = 12080;
}

void fake_scenario_free(struct fake_scenario *s)
{
	free(s->ops);
	fake_scenario_init(s);
}
