package dsync_test

import (
	"testing"

	"github.com/dsync-go/dsync/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }
