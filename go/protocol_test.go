package dlock

// The shared vectors of protocol/vectors/ against the rules in protocol.go and errors.go: the
// same files the module, the Rust and the Python clients load.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func loadVectors(t *testing.T, name string, into any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "protocol", "vectors", name))
	if err != nil {
		t.Fatal(err)
	}
	decoder := json.NewDecoder(bytesReader(data))
	decoder.UseNumber()
	if err := decoder.Decode(into); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func TestChannelNamesAreTheVectors(t *testing.T) {
	var vectors []struct{ Resource, Channel string }
	loadVectors(t, "channels.json", &vectors)
	if len(vectors) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vectors {
		if got := ChannelName(v.Resource); got != v.Channel {
			t.Errorf("ChannelName(%q) = %q, want %q", v.Resource, got, v.Channel)
		}
		// A resource without braces, or with a hash tag, has its channel in its slot (a shard
		// channel on the resource's primary).
		open := strings.IndexByte(v.Resource, '{')
		tagged := open >= 0 && strings.IndexByte(v.Resource[open+1:], '}') > 0
		if (tagged || !strings.ContainsAny(v.Resource, "{}")) && KeySlot(v.Channel) != KeySlot(v.Resource) {
			t.Errorf("channel %q is not in the slot of %q", v.Channel, v.Resource)
		}
	}
}

func TestTokenTagsAreTheVectors(t *testing.T) {
	var vectors []struct{ Token, Tag string }
	loadVectors(t, "tags.json", &vectors)
	for _, v := range vectors {
		if got := TokenTag(v.Token); got != v.Tag {
			t.Errorf("TokenTag(%q) = %q, want %q", v.Token, got, v.Tag)
		}
	}
}

func TestWhichMessagesWakeWhomAreTheVectors(t *testing.T) {
	var vectors struct {
		Published []struct {
			Event   string
			Fence   json.Number
			Holder  *string
			Message string
		}
		Wakes []struct {
			Message string
			Tag     *string
			Wakes   bool
		}
	}
	loadVectors(t, "messages.json", &vectors)
	for _, v := range vectors.Published {
		// What a waiter reads of a published message: a hand-over names its holder's tag.
		if v.Holder != nil {
			want := fmt.Sprintf("handoff %s %s", v.Fence, TokenTag(*v.Holder))
			if v.Message != want {
				t.Errorf("handoff to %q: vector %q, rule %q", *v.Holder, v.Message, want)
			}
			if !wakes(v.Message, TokenTag(*v.Holder)) {
				t.Errorf("%q does not wake its holder", v.Message)
			}
		}
	}
	for _, v := range vectors.Wakes {
		tag := ""
		if v.Tag != nil {
			tag = *v.Tag
		}
		if got := wakes(v.Message, tag); got != v.Wakes {
			t.Errorf("wakes(%q, %q) = %v, want %v", v.Message, tag, got, v.Wakes)
		}
	}
}

func TestKeySlotsAreTheVectors(t *testing.T) {
	var vectors []struct {
		Key  string
		Slot int
	}
	loadVectors(t, "slots.json", &vectors)
	for _, v := range vectors {
		if got := KeySlot(v.Key); got != v.Slot {
			t.Errorf("KeySlot(%q) = %d, want %d", v.Key, got, v.Slot)
		}
	}
}

type commandVector struct {
	Name     string
	Form     string
	Resource string
	Token    string
	TTLMS    *int64 `json:"ttl_ms"`
	Mode     string
	Permits  int
	WaitMS   *int64 `json:"wait_ms"`
	QueueMS  int64  `json:"queue_ms"`
	ClaimMS  int64  `json:"claim_ms"`
	Meta     *string
	Fence    uint64
	Inner    []string
	Args     []string
	Notify   uint64
}

func TestCommandArgumentsAreTheVectors(t *testing.T) {
	var vectors []commandVector
	loadVectors(t, "commands.json", &vectors)
	forms := map[string]int{}
	for _, v := range vectors {
		forms[v.Form]++
		checkCommand(t, v)
	}
	for _, form := range []string{"acquire", "renew", "release", "fencecheck", "info", "fenced"} {
		if forms[form] == 0 {
			t.Errorf("no vector of the form %q", form)
		}
	}
}

// checkCommand builds the command v describes and compares it with v's args.
func checkCommand(t *testing.T, v commandVector) {
	t.Helper()
	var args []any
	switch v.Form {
	case "acquire":
		f := acquireForm{resource: v.Resource, token: v.Token, ttlMS: *v.TTLMS,
			queueMS: v.QueueMS, claimMS: v.ClaimMS, notify: v.Notify}
		switch v.Mode {
		case "shared":
			f.mode = mode{shared: true}
		case "permits":
			f.mode = mode{shared: true, permits: v.Permits}
		}
		if v.WaitMS != nil {
			f.hasWait, f.waitMS = true, *v.WaitMS
		}
		if v.Meta != nil {
			f.meta, f.hasMeta = *v.Meta, true
		}
		args = f.args()
	case "renew":
		args = renewArgs(v.Resource, v.Token, *v.TTLMS, v.Fence)
	case "release":
		args = releaseArgs(v.Resource, v.Token, v.Fence)
	case "fencecheck":
		args = fenceCheckArgs(v.Resource, v.Fence)
	case "info":
		args = infoArgs(v.Resource)
	case "fenced":
		inner := make([]any, len(v.Inner))
		for i, arg := range v.Inner {
			inner[i] = arg
		}
		args = fencedArgs(v.Resource, v.Fence, inner)
	default:
		t.Fatalf("%s: unknown form %q", v.Name, v.Form)
	}
	got := make([]string, len(args))
	for i, arg := range args {
		got[i] = arg.(string)
	}
	if !reflect.DeepEqual(got, v.Args) {
		t.Errorf("%s:\n got %q\nwant %q", v.Name, got, v.Args)
	}
}

type errorVector struct {
	Reply  string
	Class  string
	Option string
	Bound  int64
}

func TestErrorClassesAreTheVectors(t *testing.T) {
	var vectors []errorVector
	loadVectors(t, "errors.json", &vectors)
	for _, v := range vectors {
		checkError(t, v)
	}
	if Class(redis.Nil) != "" || Class(errors.New("dial tcp: connection refused")) != "" {
		t.Error("an error of the client's own side has no class")
	}
}

// checkError compares what the client reads of an error reply with v.
func checkError(t *testing.T, v errorVector) {
	t.Helper()
	{
		if got := ErrorClass(v.Reply); got != v.Class {
			t.Errorf("ErrorClass(%q) = %q, want %q", v.Reply, got, v.Class)
		}
		if got := unsupportedOption(v.Reply); got != v.Option {
			t.Errorf("unsupportedOption(%q) = %q, want %q", v.Reply, got, v.Option)
		}
		if v.Bound != 0 {
			if got := upperBound(v.Reply); got != v.Bound {
				t.Errorf("upperBound(%q) = %d, want %d", v.Reply, got, v.Bound)
			}
		}
		// As go-redis hands the reply over: a redis.Error whose text is the whole reply.
		if got := Class(proto(v.Reply)); got != v.Class {
			t.Errorf("Class(go-redis error %q) = %q, want %q", v.Reply, got, v.Class)
		}
	}
}

// notify.json whole: tickets told on their own channel (NOTIFY): the wide tag, the ticket's
// channel, granted messages, the ACQUIRE with NOTIFY, its errors and the lease's local expiry.
func TestTicketsToldOnTheirOwnChannelAreTheVectors(t *testing.T) {
	var vectors struct {
		Tags []struct {
			Token   string
			WideTag string `json:"wide_tag"`
		}
		Channels []struct{ Resource, Token, Channel string }
		Granted  []struct {
			Message  string
			Fence    *json.Number
			Request  json.Number
			WindowMS json.Number `json:"window_ms"`
		}
		Commands []commandVector
		Errors   []errorVector
		Expiry   []struct {
			SentMS   map[string]int64 `json:"sent_ms"`
			Message  string
			ExpiryMS *int64 `json:"expiry_ms"`
		}
	}
	loadVectors(t, "notify.json", &vectors)
	if len(vectors.Tags) == 0 || len(vectors.Channels) == 0 || len(vectors.Granted) == 0 ||
		len(vectors.Commands) == 0 || len(vectors.Errors) == 0 || len(vectors.Expiry) == 0 {
		t.Fatalf("a section of notify.json is empty: %+v", vectors)
	}
	for _, v := range vectors.Tags {
		if got := WideTag(v.Token); got != v.WideTag {
			t.Errorf("WideTag(%q) = %q, want %q", v.Token, got, v.WideTag)
		}
	}
	for _, v := range vectors.Channels {
		got := TicketChannelName(v.Resource, v.Token)
		if got != v.Channel {
			t.Errorf("TicketChannelName(%q, %q) = %q, want %q", v.Resource, v.Token, got, v.Channel)
		}
		// In the resource's slot, as the resource's channel is (a resource with a hash tag, or
		// without braces).
		open := strings.IndexByte(v.Resource, '{')
		tagged := open >= 0 && strings.IndexByte(v.Resource[open+1:], '}') > 0
		if (tagged || !strings.ContainsAny(v.Resource, "{}")) && KeySlot(got) != KeySlot(v.Resource) {
			t.Errorf("%q is not in the slot of %q", got, v.Resource)
		}
	}
	for _, v := range vectors.Granted {
		g, ok := grantedMessage(v.Message)
		if v.Fence == nil {
			if ok {
				t.Errorf("%q read as granted %+v", v.Message, g)
			}
			continue
		}
		want := granted{mustUint(t, *v.Fence), mustUint(t, v.Request), mustUint(t, v.WindowMS)}
		if !ok || g != want {
			t.Errorf("%q read as %v %+v, want %+v", v.Message, ok, g, want)
		}
	}
	for _, v := range vectors.Commands {
		checkCommand(t, v)
	}
	for _, v := range vectors.Errors {
		checkError(t, v)
	}
	base := time.Now()
	at := func(ms int64) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	for _, v := range vectors.Expiry {
		var sent []time.Time
		for n := 1; ; n++ {
			ms, ok := v.SentMS[strconv.Itoa(n)]
			if !ok {
				break
			}
			sent = append(sent, at(ms))
		}
		if len(sent) != len(v.SentMS) {
			t.Fatalf("%q: requests not numbered 1, 2, 3 …: %v", v.Message, v.SentMS)
		}
		g, ok := grantedMessage(v.Message)
		if !ok {
			t.Fatalf("%q is not a granted message", v.Message)
		}
		expiry, ok := grantedExpiry(g, sent)
		switch {
		case v.ExpiryMS == nil && ok:
			t.Errorf("%q after %v: expiry %v, want none", v.Message, v.SentMS, expiry.Sub(base))
		case v.ExpiryMS != nil && (!ok || !expiry.Equal(at(*v.ExpiryMS))):
			t.Errorf("%q after %v: expiry %v (%v), want %d ms", v.Message, v.SentMS, expiry.Sub(base), ok, *v.ExpiryMS)
		}
		// Started on the message only with more than a request timeout of it left.
		if ok {
			if _, starts := startsOn(g, sent, expiry.Add(-time.Second), time.Second); starts {
				t.Errorf("%q: started with exactly the request timeout left", v.Message)
			}
			if got, starts := startsOn(g, sent, expiry.Add(-time.Second-time.Millisecond), time.Second); !starts || !got.Equal(expiry) {
				t.Errorf("%q: not started with more than the request timeout left", v.Message)
			}
		}
	}
}

// proto makes the error go-redis returns for an error reply.
func proto(reply string) error { return redisError(reply) }

type redisError string

func (e redisError) Error() string { return string(e) }
func (e redisError) RedisError()   {}

// decode turns a reply in the vectors' encoding into what go-redis returns for it: nil, int64,
// string, []any, map[any]any; an error reply becomes the error.
func decode(t *testing.T, value any) (any, error) {
	t.Helper()
	switch v := value.(type) {
	case nil:
		return nil, nil
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			t.Fatalf("integer %v: %v", v, err)
		}
		return n, nil
	case string:
		return v, nil
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			decoded, err := decode(t, item)
			if err != nil {
				t.Fatal("an error inside an array")
			}
			out[i] = decoded
		}
		return out, nil
	case map[string]any:
		if simple, ok := v["simple"]; ok {
			return simple.(string), nil
		}
		if text, ok := v["error"]; ok {
			return nil, redisError(text.(string))
		}
		if pairs, ok := v["map"]; ok {
			out := map[any]any{}
			for _, pair := range pairs.([]any) {
				kv := pair.([]any)
				key, _ := decode(t, kv[0])
				out[key], _ = decode(t, kv[1])
			}
			return out, nil
		}
	}
	t.Fatalf("cannot decode %#v", value)
	return nil, nil
}

func TestInfoRepliesAreReadAsTheVectors(t *testing.T) {
	var vectors struct {
		Info []struct {
			Name  string
			Resp  int
			Reply any
			Info  *struct {
				Owner       *string
				Fence       *json.Number
				TTLMS       int64    `json:"ttl_ms"`
				Waiters     int64    `json:"waiters"`
				NextWaiters []string `json:"next_waiters"`
				Tickets     int64
				Mode        *string
				Holders     int64
				Meta        *string
				Leases      []struct {
					Token string
					Fence json.Number
					TTLMS int64 `json:"ttl_ms"`
					Meta  *string
				}
			}
			Leader *struct {
				Token   string
				Fence   json.Number
				Address *string
			}
		}
	}
	loadVectors(t, "replies.json", &vectors)
	for _, v := range vectors.Info {
		name := fmt.Sprintf("%s (RESP%d)", v.Name, v.Resp)
		reply, _ := decode(t, v.Reply)
		info, err := parseInfo(reply)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if v.Info == nil {
			if info != nil {
				t.Errorf("%s: got %+v, want nil", name, info)
			}
		} else {
			want := &Info{Owner: v.Info.Owner, TTLMS: v.Info.TTLMS, Waiters: v.Info.Waiters,
				NextWaiters: v.Info.NextWaiters, Tickets: v.Info.Tickets, Mode: v.Info.Mode,
				Holders: v.Info.Holders, Meta: v.Info.Meta, Leases: []Holder{}}
			if v.Info.Fence != nil {
				fence := mustUint(t, *v.Info.Fence)
				want.Fence = &fence
			}
			for _, l := range v.Info.Leases {
				want.Leases = append(want.Leases, Holder{Token: l.Token, Fence: mustUint(t, l.Fence), TTLMS: l.TTLMS, Meta: l.Meta})
			}
			if !reflect.DeepEqual(info, want) {
				t.Errorf("%s:\n got %s\nwant %s", name, show(info), show(want))
			}
		}
		leader, err := leaderFromInfo(reply)
		if err != nil {
			t.Fatal(err)
		}
		var want *Leader
		if v.Leader != nil {
			want = &Leader{Token: v.Leader.Token, Fence: mustUint(t, v.Leader.Fence), Address: v.Leader.Address}
		}
		if !reflect.DeepEqual(leader, want) {
			t.Errorf("%s: leader %s, want %s", name, show(leader), show(want))
		}
	}
}

func TestFencedRepliesAreClassifiedAsTheVectors(t *testing.T) {
	var vectors struct {
		Fenced []struct {
			Name  string
			Reply any
			Class *string
		}
	}
	loadVectors(t, "replies.json", &vectors)
	for _, v := range vectors.Fenced {
		reply, replyErr := decode(t, v.Reply)
		got, err := fencedOutcome("invoice:1", 5, reply, replyErr)
		switch {
		case v.Class == nil:
			if err != nil || !reflect.DeepEqual(got, reply) {
				t.Errorf("%s: got %v, %v; want the inner reply %v passed through", v.Name, got, err, reply)
			}
		case *v.Class == ClassStale:
			var stale *StaleError
			if !errors.As(err, &stale) || !errors.Is(err, ErrStale) || stale.Fence != 5 {
				t.Errorf("%s: got %v, want a *StaleError", v.Name, err)
			}
		default:
			if Class(err) != *v.Class {
				t.Errorf("%s: class %q, want %q", v.Name, Class(err), *v.Class)
			}
			if *v.Class == ClassCrossSlot && !errors.Is(err, ErrCrossSlot) {
				t.Errorf("%s: not errors.Is ErrCrossSlot", v.Name)
			}
		}
	}
}

func TestSimpleRepliesMeanWhatTheVectorsSay(t *testing.T) {
	var vectors struct {
		Simple []struct {
			Name    string
			Command string
			Reply   any
			Value   any
		}
	}
	loadVectors(t, "replies.json", &vectors)
	for _, v := range vectors.Simple {
		reply, _ := decode(t, v.Reply)
		switch v.Command {
		case "acquire":
			fence, err := fenceOf(reply)
			want := uint64(0)
			if v.Value != nil {
				want = mustUint(t, v.Value.(json.Number))
			}
			if err != nil || fence != want {
				t.Errorf("%s: fence %d (%v), want %d", v.Name, fence, err, want)
			}
		default:
			n, err := asInt(reply)
			if err != nil || (n == 1) != v.Value.(bool) {
				t.Errorf("%s: %d (%v), want %v", v.Name, n, err, v.Value)
			}
		}
	}
}

func mustUint(t *testing.T, n json.Number) uint64 {
	t.Helper()
	var value uint64
	if _, err := fmt.Sscan(n.String(), &value); err != nil {
		t.Fatal(err)
	}
	return value
}

func show(value any) string {
	data, _ := json.Marshal(value)
	return string(data)
}

func TestRevokedMessagesAreReadAsTheVectors(t *testing.T) {
	var vectors struct {
		Revoked []struct {
			Message string
			Fence   *json.Number // null: not a revocation
			Reason  string
		}
	}
	loadVectors(t, "messages.json", &vectors)
	if len(vectors.Revoked) == 0 {
		t.Fatal("no revoked vectors")
	}
	for _, v := range vectors.Revoked {
		fence, reason, ok := revokedMessage(v.Message)
		if v.Fence == nil {
			if ok {
				t.Errorf("%q read as a revocation of %d (%q)", v.Message, fence, reason)
			}
			continue
		}
		if !ok || v.Fence.String() != strconv.FormatUint(fence, 10) || reason != v.Reason {
			t.Errorf("%q read as %v, fence %d, reason %q; want fence %s, reason %q",
				v.Message, ok, fence, reason, v.Fence, v.Reason)
		}
	}
}

func bytesReader(data []byte) *bytes.Reader { return bytes.NewReader(data) }

// The rules written once in protocol.go that the vectors do not pin: the claim window, the
// options that may be dropped, the server's longest wait, a length as sent.
func TestTheClientsOwnRulesAreWrittenOnce(t *testing.T) {
	for _, c := range []struct {
		requestTimeout time.Duration
		ticketMS, want int64
	}{
		{2 * time.Second, 0, 4000},
		{200 * time.Millisecond, 0, 1000}, // at least 1 s
		{2 * time.Second, 6000, 6000},     // a ticket's: at least the ticket
	} {
		if got := claimWindowMS(c.requestTimeout, c.ticketMS); got != c.want {
			t.Errorf("claimWindowMS(%v, %d) = %d, want %d", c.requestTimeout, c.ticketMS, got, c.want)
		}
	}
	for option, droppable := range map[string]bool{"CLAIM": true, "FENCE": true, "META": true, "QUEUE": true, "NOTIFY": true,
		"SHARED": false, "LIMIT": false, "WAIT": false} {
		reply := "ERR syntax error: unexpected argument '" + option + "'"
		if got := droppableOption(reply) != ""; got != droppable {
			t.Errorf("droppableOption(%q) = %v", reply, got)
		}
	}
	if got := waitTooLong("ERR timeout-ms must be an integer between 0 and 86400000"); got != 24*time.Hour {
		t.Errorf("the longest wait: %v", got)
	}
	if got := waitTooLong("ERR ttl-ms must be an integer between 1 and 86400000"); got != 0 {
		t.Errorf("a ttl's bound read as the longest wait: %v", got)
	}
	if got := asSent(900*time.Millisecond + 999*time.Microsecond); got != 900*time.Millisecond {
		t.Errorf("a ttl as sent: %v", got)
	}
	if got := renewEvery(900 * time.Millisecond); got != 300*time.Millisecond {
		t.Errorf("the renewal period: %v", got)
	}
}

func TestTheSetsCommandsAsSent(t *testing.T) {
	set := []string{"{acct}:bob", "{acct}:alice"}
	for _, c := range []struct {
		got, want []any
	}{
		{acquireAllArgs(set, "t", 30000, 0, "", false),
			[]any{"DLOCK.ACQUIREALL", "2", "{acct}:bob", "{acct}:alice", "t", "30000"}},
		{acquireAllArgs(set, "t", 30000, 8000, "m", true),
			[]any{"DLOCK.ACQUIREALL", "2", "{acct}:bob", "{acct}:alice", "t", "30000", "QUEUE", "8000", "META", "m"}},
		{renewAllArgs(set, "t", 30000, []uint64{11, 12}),
			[]any{"DLOCK.RENEWALL", "2", "{acct}:bob", "{acct}:alice", "t", "30000", "FENCES", "11", "12"}},
		{releaseAllArgs(set, "t", []uint64{11, 12}),
			[]any{"DLOCK.RELEASEALL", "2", "{acct}:bob", "{acct}:alice", "t", "FENCES", "11", "12"}},
		{releaseAllArgs(set, "t", nil), []any{"DLOCK.RELEASEALL", "2", "{acct}:bob", "{acct}:alice", "t"}},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%v, want %v", c.got, c.want)
		}
	}
	// A set's ticket lives as long as its wait, from 1 s to 30 s (a wait without limit: 30 s).
	for wait, want := range map[time.Duration]time.Duration{
		200 * time.Millisecond: time.Second, 8 * time.Second: 8 * time.Second,
		time.Hour: 30 * time.Second, time.Duration(1<<63 - 1): 30 * time.Second,
	} {
		if got := setTicket(wait); got != want {
			t.Errorf("setTicket(%v) = %v, want %v", wait, got, want)
		}
	}
	if fences, err := fencesOf([]any{int64(11), int64(12)}, 2); err != nil || !reflect.DeepEqual(fences, []uint64{11, 12}) {
		t.Errorf("fencesOf: %v, %v", fences, err)
	}
	if fences, err := fencesOf(nil, 2); err != nil || fences != nil {
		t.Errorf("fencesOf(nil): %v, %v", fences, err)
	}
	if _, err := fencesOf([]any{int64(11)}, 2); err == nil {
		t.Error("fencesOf took one fence for a set of two")
	}
}
