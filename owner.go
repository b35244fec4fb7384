package dsync

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

type ownerKey struct{}

// callOwner is owner for a call that takes a hold: it also returns ctx's
// error if ctx is done already, when such a call makes no attempt.
func callOwner(ctx context.Context) (tok string, owned bool, err error) {
	if tok, owned, err = owner(ctx); err == nil {
		err = ctx.Err()
	}
	return tok, owned, err
}

// maxTokenLen bounds owner tokens so they fit in Redis fields and RPC metadata.
const maxTokenLen = 256

// WithOwner returns a copy of ctx that carries a new owner: a random,
// unguessable token. Locks taken with the returned context belong to that
// owner, which may re-enter them and alone may release them.
func WithOwner(ctx context.Context) context.Context {
	return context.WithValue(ctx, ownerKey{}, uuid.NewString())
}

// WithOwnerToken returns a copy of ctx whose owner is tok, typically a token
// read with [OwnerToken] in another process and carried over in RPC
// metadata, so that both processes act as one owner. A token must be
// non-empty and at most 256 bytes, must not begin with ':' and must not
// contain a space or a newline (the scripts store tokens in
// space-separated lists); calls made with an unusable token fail with
// [ErrInvalid]. Tokens made by [WithOwner] always qualify.
func WithOwnerToken(ctx context.Context, tok string) context.Context {
	return context.WithValue(ctx, ownerKey{}, tok)
}

// OwnerToken returns the owner token carried by ctx, or "" if ctx has no
// owner.
func OwnerToken(ctx context.Context) string {
	tok, _ := ctx.Value(ownerKey{}).(string)
	return tok
}

// owner returns ctx's owner token and whether there is one.
func owner(ctx context.Context) (string, bool, error) {
	v := ctx.Value(ownerKey{})
	if v == nil {
		return "", false, nil
	}
	tok := v.(string)
	if tok == "" || len(tok) > maxTokenLen || strings.HasPrefix(tok, ":") || strings.ContainsAny(tok, " \n") {
		return "", false, fmt.Errorf("%w: owner token %q", ErrInvalid, tok)
	}
	return tok, true, nil
}

// newToken returns a fresh random owner token: a version 4 UUID, as
// uuid.NewString makes, in one allocation (uuid.NewRandom reads into a
// UUID on the heap).
func newToken() string {
	var u uuid.UUID
	_, _ = rand.Read(u[:])
	u[6] = u[6]&0x0f | 0x40 // version 4
	u[8] = u[8]&0x3f | 0x80 // variant RFC 4122
	return u.String()
}
