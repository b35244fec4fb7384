package dsync

import (
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"strconv"
	"strings"
)

// Hand-overs: a release that frees a hold for a waiting call gives it
// straight to that call and publishes a message naming it, its holder and
// the fencing token, with a proof that a script sent it (see lua/lib.lua).
// This file holds how a call is named in those messages, the proofs and
// their parsing; the notifier (wait.go) delivers them to the watchers
// (watcher.go) of the calls they concern.

// An addressee is a waiting call as hand-overs name it.
type addressee struct {
	id     string // the call id
	secret string // given to the scripts; a hand-over proves it knew it
	tok    string // the holder token, never sent on a channel
	// The Client's inbox suffix (see notifier.inbox) at the end of
	// secret, when hand-overs to the call go to the Client's own channel
	// of the name; "" when they go to the name's channel.
	inbox string
}

// newAddressee returns the addressee of a new call of holder tok with id.
// With inbox (a notifier's, see notifier.inbox), hand-overs to the call
// are published on its Client's own channel of the name: inbox is for a
// holder token that no call of another Client can hold (a call without an
// owner), since a hand-over to the call also wakes the other waiting calls
// of its holder, and only those of this Client receive it there.
func newAddressee(tok, id, inbox string) addressee {
	var b [16 + 64]byte
	var r [16]byte
	_, _ = rand.Read(r[:])
	s := hex.AppendEncode(b[:0], r[:])
	s = append(s, inbox...)
	return addressee{id: id, secret: string(s), tok: tok, inbox: inbox}
}

// next returns the addressee of the call a, started again under id.
func (a addressee) next(id string) addressee { return newAddressee(a.tok, id, a.inbox) }

func digest(s string) string {
	d := sha1.Sum([]byte(s))
	return hex.EncodeToString(d[:])
}

// A sum is a SHA-1 digest as bytes: a waiter compares it with the hex
// digests hand-over messages carry without making a string of either.
type sum [sha1.Size]byte

// holderSum returns the digest of holder token tok, as a hand-over names
// the holder it went to.
func holderSum(tok string) sum {
	var buf [512]byte // a token fits (maxTokenLen, and a Client's suffix)
	return sha1.Sum(append(buf[:0], tok...))
}

// proofSum returns the proof a hand-over of the hold with fencing token f
// to the call with secret carries: the digest of the secret, a space and f
// in decimal (see lua/lib.lua).
func proofSum(secret string, f uint64) sum {
	var buf [128]byte // a secret is 32 bytes, 66 with an inbox
	b := append(buf[:0], secret...)
	b = append(b, ' ')
	return sha1.Sum(strconv.AppendUint(b, f, 10))
}

// is reports whether h is d in hex, as the scripts write digests.
func (d sum) is(h string) bool {
	var b [2 * sha1.Size]byte
	hex.Encode(b[:], d[:])
	return string(b[:]) == h
}

// A handover is a hand-over message parsed: "<call id> <holder digest>
// <fencing token> <proof>" (see lua/lib.lua). ok is false for a message of
// another shape; its id is set if it has four words.
type handover struct {
	id, holder, proof string
	f                 uint64
	ok                bool
}

// parseHandover parses hand-over message p, once for all its watchers.
func parseHandover(p string) handover {
	id, rest, ok1 := strings.Cut(p, " ")
	holder, rest, ok2 := strings.Cut(rest, " ")
	fs, proof, ok3 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !ok3 || strings.Contains(proof, " ") {
		return handover{}
	}
	f, err := strconv.ParseUint(fs, 10, 64)
	if err != nil {
		return handover{id: id}
	}
	return handover{id: id, holder: holder, proof: proof, f: f, ok: true}
}
