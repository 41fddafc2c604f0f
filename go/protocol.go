package dlock

// dlock's wire rules, written once for this client: channel names, the hand-over tag, channel
// messages, key slots, the argument vector of every command form, error classes and reading
// DLOCK.INFO. No I/O here. protocol/vectors/*.json pins every rule (protocol_test.go loads
// them); docs/protocol.md is the contract in prose.

import (
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
)

// The commands.
const (
	cmdAcquire    = "DLOCK.ACQUIRE"
	cmdRenew      = "DLOCK.RENEW"
	cmdRelease    = "DLOCK.RELEASE"
	cmdFenceCheck = "DLOCK.FENCECHECK"
	cmdFenced     = "DLOCK.FENCED"
	cmdInfo       = "DLOCK.INFO"
	cmdAcquireAll = "DLOCK.ACQUIREALL"
	cmdRenewAll   = "DLOCK.RENEWALL"
	cmdReleaseAll = "DLOCK.RELEASEALL"
)

// MaxSetSize is the most resources one set (HoldAll) may have: the server's bound on numkeys.
const MaxSetSize = 64

// A set's ticket (ACQUIREALL … QUEUE ticket-ms) lives as long as its wait, within these bounds;
// a wait without limit has tickets of setTicketMax.
const (
	setTicketMin = time.Second
	setTicketMax = 30 * time.Second
)

// setTicket is the life of a set's ticket for a wait of left (longer than setTicketMax: no
// limit).
func setTicket(left time.Duration) time.Duration {
	return min(setTicketMax, max(setTicketMin, left))
}

// MaxPermits is the server's bound on a semaphore's permits (SHARED LIMIT n).
const MaxPermits = 1_000_000

// The option keywords of the version 2 commands.
var optionKeywords = []string{"CLAIM", "FENCE", "LIMIT", "META", "NOTIFY", "QUEUE", "SHARED", "WAIT"}

// droppableOptions may be left out for a server that refuses them as unknown (an older module):
// the command goes again without them (FENCE only to the server that refused it; QUEUE makes
// the attempt wait with WAIT instead; NOTIFY makes the ticket wait on the resource's channel,
// subscribed before the ACQUIRE goes again).
var droppableOptions = []string{"CLAIM", "FENCE", "META", "NOTIFY", "QUEUE"}

// droppableOption is the option an error reply refused as unknown if it may be left out, or "".
func droppableOption(reply string) string {
	option := unsupportedOption(reply)
	for _, droppable := range droppableOptions {
		if option == droppable {
			return option
		}
	}
	return ""
}

// The claim window: twice the request timeout, at least claimAtLeast (a ticket's: at least the
// ticket's length); the form caps it by the ttl.
const claimAtLeast = time.Second

// claimWindowMS is the claim window sent with a WAIT (ticketMS 0) or a QUEUE ticket-ms, in
// milliseconds, before the ttl's cap (acquireForm.args).
func claimWindowMS(requestTimeout time.Duration, ticketMS int64) int64 {
	return max(claimAtLeast.Milliseconds(), 2*requestTimeout.Milliseconds(), ticketMS)
}

// renewEvery is the renewal period of a lease of ttl, renewRetry the pause after a renewal that
// got no answer (retried until the local expiry).
func renewEvery(ttl time.Duration) time.Duration { return ttl / 3 }
func renewRetry(ttl time.Duration) time.Duration { return ttl / 10 }

// millis is a duration as the server is told a length: whole milliseconds rounded down (a
// lease is never longer than asked), at least 1.
func millis(d time.Duration) int64 { return max(1, d.Milliseconds()) }

// asSent is a length as the server got it (millis): the local expiry counts this ttl, never the
// unrounded one, so it is never later than the server's deadline.
func asSent(d time.Duration) time.Duration { return time.Duration(millis(d)) * time.Millisecond }

// millisUp is a wait as the server is told it: whole milliseconds rounded up, at least 1.
func millisUp(d time.Duration) int64 {
	return max(1, int64((d+time.Millisecond-1)/time.Millisecond))
}

// ChannelName is the channel where the server publishes resource's changes of ownership: a
// resource with braces keeps them, and its hash tag, behind "dlock:key:" (invoice:{7} →
// dlock:key:invoice:{7}); any other is wrapped in a tag (invoice:7 → dlock:{invoice:7}), so the
// channel lives in the key's slot and no two resources share one.
func ChannelName(resource string) string {
	if strings.ContainsAny(resource, "{}") {
		return "dlock:key:" + resource
	}
	return "dlock:{" + resource + "}"
}

// TokenTag is the tag a handoff message names its new holder by: FNV-1a 32-bit of the token's
// UTF-8 bytes, as 8 lowercase hex digits.
func TokenTag(token string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(token)) // a hash.Hash never fails to write
	return fmt.Sprintf("%08x", h.Sum32())
}

// WideTag is the tag a ticket's own channel is named by: FNV-1a 64-bit of the token's UTF-8
// bytes, as 16 lowercase hex digits (wide enough that two waiting tokens never share a channel,
// since a ticket starts on that channel's message alone).
func WideTag(token string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(token)) // a hash.Hash never fails to write
	return fmt.Sprintf("%016x", h.Sum64())
}

// TicketChannelName is the channel where the server tells the ticket of token on resource alone
// of its grant (an ACQUIRE … QUEUE … NOTIFY): the resource's channel, ":" and the token's
// WideTag (invoice:123 and token a → dlock:{invoice:123}:af63dc4c8601ec8c). It is in the
// resource's slot.
func TicketChannelName(resource, token string) string {
	return ChannelName(resource) + ":" + WideTag(token)
}

// granted is what a ticket's own channel says when its lease is handed over: "granted <fence>
// <request> <window-ms>", the lease's fence, the NOTIFY number of the ticket's latest ACQUIRE
// the server read before the hand-over, and how long the lease runs from the hand-over unless
// claimed.
type granted struct {
	fence, request, windowMS uint64
}

// grantedMessage reads a granted message (three unsigned decimal numbers, nothing else); ok is
// false for any other message.
func grantedMessage(message string) (g granted, ok bool) {
	rest, ok := strings.CutPrefix(message, "granted ")
	if !ok {
		return granted{}, false
	}
	words := strings.Split(rest, " ")
	if len(words) != 3 {
		return granted{}, false
	}
	var numbers [3]uint64
	for i, word := range words {
		if word == "" || strings.TrimLeft(word, "0123456789") != "" {
			return granted{}, false
		}
		n, err := strconv.ParseUint(word, 10, 64)
		if err != nil {
			return granted{}, false
		}
		numbers[i] = n
	}
	return granted{fence: numbers[0], request: numbers[1], windowMS: numbers[2]}, true
}

// grantedExpiry is the local expiry of the lease g announces: the send time of the attempt's
// ACQUIRE number g.request (sent[n-1], taken before it was sent) plus the window; that request
// reached the server before the hand-over, so this is never after the server's deadline. ok is
// false when the request is not one of the attempt's.
func grantedExpiry(g granted, sent []time.Time) (expiry time.Time, ok bool) {
	if g.request < 1 || g.request > uint64(len(sent)) {
		return time.Time{}, false
	}
	window := time.Duration(1<<63 - 1)
	if g.windowMS < uint64(window/time.Millisecond) {
		window = time.Duration(g.windowMS) * time.Millisecond
	}
	return sent[g.request-1].Add(window), true
}

// startsOn says whether a ticket starts on its granted message g, and with what local expiry:
// only when the request is the attempt's and more than the request timeout is left of the
// window at now (the lease's claim, a RENEW, has that long to arrive). Otherwise the next
// ACQUIRE claims the turn with its reply.
func startsOn(g granted, sent []time.Time, now time.Time, requestTimeout time.Duration) (time.Time, bool) {
	expiry, ok := grantedExpiry(g, sent)
	if !ok || !expiry.After(now.Add(requestTimeout)) {
		return time.Time{}, false
	}
	return expiry, true
}

// wakes says whether a channel message wakes a watcher with tag ("" is an observer, woken by
// every message). acquired, renewed, released and expired wake no ticket waiter (a release with
// a line always hands over); a handoff wakes the token it names; a handoff without a tag (an
// older server) and any message this version does not understand wake every waiter.
func wakes(message, tag string) bool {
	if tag == "" {
		return true
	}
	words := strings.Split(message, " ")
	switch {
	case len(words) == 2 && (words[0] == "acquired" || words[0] == "renewed" ||
		words[0] == "released" || words[0] == "expired"):
		return false
	case len(words) == 3 && words[0] == "handoff":
		return words[2] == tag
	}
	return true
}

// revokedMessage reads a channel message that a DLOCK.REVOKE published: "revoked <fence>" and,
// when the operator gave one, " <reason>" (the rest of the message, spaces included). ok is
// false for any other message.
func revokedMessage(message string) (fence uint64, reason string, ok bool) {
	rest, ok := strings.CutPrefix(message, "revoked ")
	if !ok {
		return 0, "", false
	}
	digits, reason, _ := strings.Cut(rest, " ")
	fence, err := strconv.ParseUint(digits, 10, 64)
	if err != nil {
		return 0, "", false
	}
	return fence, reason, true
}

// KeySlot is the Redis Cluster slot of key: CRC16/XMODEM of its hash tag (the text between the
// first "{" and the next "}", if not empty) or of the whole key, modulo 16384.
func KeySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for bit := 0; bit < 8; bit++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % 16384
}

// mode is the kind of lease an acquire asks for.
type mode struct {
	shared  bool
	permits int // with shared: a semaphore of this many permits; 0 for a reader
}

func (m mode) name() string {
	if m.shared {
		return "shared"
	}
	return "exclusive"
}

// acquireForm is one DLOCK.ACQUIRE as sent; zero durations leave their option out, except wait
// (hasWait) whose 0 means "no limit".
type acquireForm struct {
	resource, token string
	ttlMS           int64
	mode            mode
	hasWait         bool
	waitMS          int64
	queueMS         int64
	claimMS         int64
	meta            string
	hasMeta         bool
	notify          uint64 // NOTIFY request, only with a ticket (queueMS); 0: none
}

// args: DLOCK.ACQUIRE resource token ttl-ms [SHARED [LIMIT n]] [WAIT ms | QUEUE ms [NOTIFY
// request]] [CLAIM ms] [META value]. CLAIM goes only with a wait or a ticket (a grant answered
// at once is claimed by its answer) and never longer than the ttl; NOTIFY only with a ticket.
func (f acquireForm) args() []any {
	args := []any{cmdAcquire, f.resource, f.token, num(f.ttlMS)}
	if f.mode.shared {
		args = append(args, "SHARED")
		if f.mode.permits > 0 {
			args = append(args, "LIMIT", num(int64(f.mode.permits)))
		}
	}
	waiting := false
	if f.queueMS > 0 {
		args = append(args, "QUEUE", num(f.queueMS))
		if f.notify > 0 {
			args = append(args, "NOTIFY", unum(f.notify))
		}
		waiting = true
	} else if f.hasWait {
		args = append(args, "WAIT", num(f.waitMS))
		waiting = true
	}
	if f.claimMS > 0 && waiting {
		args = append(args, "CLAIM", num(min(f.claimMS, f.ttlMS)))
	}
	if f.hasMeta {
		args = append(args, "META", f.meta)
	}
	return args
}

// renewArgs: DLOCK.RENEW resource token ttl-ms [FENCE fence]; with the grant's fence (0: none,
// for a server without FENCE) so a late or retried RENEW never extends a later grant.
func renewArgs(resource, token string, ttlMS int64, fence uint64) []any {
	args := []any{cmdRenew, resource, token, num(ttlMS)}
	if fence != 0 {
		args = append(args, "FENCE", unum(fence))
	}
	return args
}

// releaseArgs: DLOCK.RELEASE resource token [FENCE fence]. Without a fence (an attempt whose
// outcome is unknown) it frees that attempt's grant and takes its ticket out of line.
func releaseArgs(resource, token string, fence uint64) []any {
	args := []any{cmdRelease, resource, token}
	if fence != 0 {
		args = append(args, "FENCE", unum(fence))
	}
	return args
}

// acquireAllArgs: DLOCK.ACQUIREALL numkeys resource … token ttl-ms [QUEUE ticket-ms] [META
// value]: every resource of the set in the caller's order (the fences come back in that
// order), or none. A set waits with QUEUE only (the server refuses WAIT); queueMS 0 leaves it
// out.
func acquireAllArgs(resources []string, token string, ttlMS, queueMS int64, meta string, hasMeta bool) []any {
	args := setArgs(cmdAcquireAll, resources, token)
	args = append(args, num(ttlMS))
	if queueMS > 0 {
		args = append(args, "QUEUE", num(queueMS))
	}
	if hasMeta {
		args = append(args, "META", meta)
	}
	return args
}

// renewAllArgs: DLOCK.RENEWALL numkeys resource … token ttl-ms FENCES fence …: every member
// renewed, or none, each only under the fence of its grant.
func renewAllArgs(resources []string, token string, ttlMS int64, fences []uint64) []any {
	args := setArgs(cmdRenewAll, resources, token)
	args = append(args, num(ttlMS))
	return appendFences(args, fences)
}

// releaseAllArgs: DLOCK.RELEASEALL numkeys resource … token [FENCES fence …]. Without fences (an
// attempt whose wait ended, or whose outcome is unknown) it frees whatever that attempt's token
// holds of the set and takes its tickets out of every line.
func releaseAllArgs(resources []string, token string, fences []uint64) []any {
	return appendFences(setArgs(cmdReleaseAll, resources, token), fences)
}

func setArgs(command string, resources []string, token string) []any {
	args := make([]any, 0, len(resources)+6+len(resources))
	args = append(args, command, num(int64(len(resources))))
	for _, resource := range resources {
		args = append(args, resource)
	}
	return append(args, token)
}

func appendFences(args []any, fences []uint64) []any {
	if len(fences) == 0 {
		return args
	}
	args = append(args, "FENCES")
	for _, fence := range fences {
		args = append(args, unum(fence))
	}
	return args
}

func fenceCheckArgs(resource string, fence uint64) []any {
	return []any{cmdFenceCheck, resource, unum(fence)}
}

func infoArgs(resource string) []any { return []any{cmdInfo, resource} }

// fencedArgs: DLOCK.FENCED resource fence command [arg …].
func fencedArgs(resource string, fence uint64, command []any) []any {
	return append([]any{cmdFenced, resource, unum(fence)}, command...)
}

func num(n int64) string   { return strconv.FormatInt(n, 10) }
func unum(n uint64) string { return strconv.FormatUint(n, 10) }

// Error classes of server replies (docs/protocol.md, section 9).
const (
	ClassRedirect     = "redirect"
	ClassRetry        = "retry"
	ClassFailover     = "failover"
	ClassUnblocked    = "unblocked"
	ClassStale        = "stale"
	ClassCrossSlot    = "cross_slot"
	ClassModeConflict = "mode_conflict"
	ClassUnsupported  = "unsupported"
	ClassAuth         = "auth"
	ClassWrongType    = "wrong_type"
	ClassUsage        = "usage"
	ClassServer       = "server"
)

var classByCode = map[string]string{
	"MOVED":       ClassRedirect,
	"ASK":         ClassRedirect,
	"TRYAGAIN":    ClassRetry,
	"LOADING":     ClassRetry,
	"CLUSTERDOWN": ClassRetry,
	"MASTERDOWN":  ClassRetry,
	"READONLY":    ClassFailover,
	"UNBLOCKED":   ClassUnblocked,
	"STALE":       ClassStale,
	"CROSSSLOT":   ClassCrossSlot,
	"LOCKMODE":    ClassModeConflict,
	"NOAUTH":      ClassAuth,
	"WRONGPASS":   ClassAuth,
	"NOPERM":      ClassAuth,
	"WRONGTYPE":   ClassWrongType,
}

const unexpectedArgument = "ERR syntax error: unexpected argument '"

// ErrorClass is the class of an error reply (its whole text, code first): what a client does
// next.
func ErrorClass(reply string) string {
	code, _, _ := strings.Cut(reply, " ")
	if class, ok := classByCode[code]; ok {
		return class
	}
	if code == "ERR" {
		if unsupportedOption(reply) != "" {
			return ClassUnsupported
		}
		if strings.HasPrefix(reply, "ERR fence counter exhausted") ||
			strings.HasPrefix(reply, "ERR internal error") {
			return ClassServer
		}
		return ClassUsage
	}
	return ClassServer
}

// unsupportedOption is the option keyword an older server refused as an unknown argument, upper
// case, or "".
func unsupportedOption(reply string) string {
	if !strings.HasPrefix(reply, unexpectedArgument) || !strings.HasSuffix(reply, "'") {
		return ""
	}
	named := strings.ToUpper(reply[len(unexpectedArgument) : len(reply)-1])
	for _, option := range optionKeywords {
		if named == option {
			return named
		}
	}
	return ""
}

// waitTooLong is the longest WAIT the server allows when reply refused a longer one ("ERR
// timeout-ms must be between 0 and 86400000"), or 0 for any other reply.
func waitTooLong(reply string) time.Duration {
	if !strings.HasPrefix(reply, "ERR timeout-ms ") {
		return 0
	}
	if bound := upperBound(reply); bound > 0 {
		return time.Duration(bound) * time.Millisecond
	}
	return 0
}

// upperBound is the largest value a bounds error allows ("… between 0 and 86400000" →
// 86400000), or -1.
func upperBound(reply string) int64 {
	at := strings.LastIndex(reply, " between ")
	if at < 0 {
		return -1
	}
	_, upper, found := strings.Cut(reply[at+len(" between "):], " and ")
	if !found {
		return -1
	}
	digits, _, _ := strings.Cut(upper, " ")
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// Holder is one live shared lease in DLOCK.INFO's leases.
type Holder struct {
	Token string
	Fence uint64
	TTLMS int64
	Meta  *string
}

// Info is what DLOCK.INFO shows, read by field name (fields of later versions change nothing).
type Info struct {
	Owner       *string
	Fence       *uint64
	TTLMS       int64
	Waiters     int64
	NextWaiters []string
	Tickets     int64
	Mode        *string
	Holders     int64
	Meta        *string
	Leases      []Holder
}

// Leader is who leads an election: its candidate's address (the lease's META; nil without
// one), the term's fence (larger for every newer term) and the lease's token.
type Leader struct {
	Address *string
	Fence   uint64
	Token   string
}

// parseInfo reads a DLOCK.INFO reply as go-redis returns it: a flat list of names and values
// (RESP2) or a map (RESP3); nil for nil (no lease, nobody waiting).
func parseInfo(reply any) (*Info, error) {
	if reply == nil {
		return nil, nil
	}
	fields := map[string]any{}
	switch value := reply.(type) {
	case map[any]any:
		for name, field := range value {
			if text, ok := name.(string); ok {
				fields[text] = field
			}
		}
	case map[string]any:
		for name, field := range value {
			fields[name] = field
		}
	case []any:
		for i := 0; i+1 < len(value); i += 2 {
			if text, ok := value[i].(string); ok {
				fields[text] = value[i+1]
			}
		}
	default:
		return nil, fmt.Errorf("dlock: unexpected DLOCK.INFO reply %v", reply)
	}
	info := &Info{
		Owner:   text(fields["owner"]),
		TTLMS:   count(fields["ttl-ms"]),
		Waiters: count(fields["waiters"]),
		Tickets: count(fields["tickets"]),
		Mode:    text(fields["mode"]),
		Holders: count(fields["holders"]),
		Meta:    text(fields["meta"]),
	}
	if fence, ok := unsigned(fields["fence"]); ok {
		info.Fence = &fence
	}
	info.NextWaiters = []string{}
	if list, ok := fields["next-waiters"].([]any); ok {
		for _, item := range list {
			if token := text(item); token != nil {
				info.NextWaiters = append(info.NextWaiters, *token)
			}
		}
	}
	info.Leases = []Holder{}
	if list, ok := fields["leases"].([]any); ok {
		for _, item := range list {
			lease, ok := item.([]any)
			if !ok || len(lease) < 4 {
				continue
			}
			holder := Holder{TTLMS: count(lease[2]), Meta: text(lease[3])}
			if token := text(lease[0]); token != nil {
				holder.Token = *token
			}
			holder.Fence, _ = unsigned(lease[1])
			info.Leases = append(info.Leases, holder)
		}
	}
	return info, nil
}

// leaderFromInfo is the leader DLOCK.INFO shows: the holder of a live exclusive lease (a
// version 1 server shows no mode, and its lease is exclusive), or nil.
func leaderFromInfo(reply any) (*Leader, error) {
	info, err := parseInfo(reply)
	if err != nil || info == nil || info.Owner == nil || info.Fence == nil {
		return nil, err
	}
	if info.Mode != nil && *info.Mode != "exclusive" {
		return nil, nil
	}
	return &Leader{Address: info.Meta, Fence: *info.Fence, Token: *info.Owner}, nil
}

func text(value any) *string {
	switch v := value.(type) {
	case string:
		return &v
	case []byte:
		s := string(v)
		return &s
	}
	return nil
}

func count(value any) int64 {
	switch v := value.(type) {
	case int64:
		return v
	case string:
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	return 0
}

func unsigned(value any) (uint64, bool) {
	switch v := value.(type) {
	case int64:
		return uint64(v), v >= 0
	case uint64:
		return v, true
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}
