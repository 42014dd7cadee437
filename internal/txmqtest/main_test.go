package txmqtest_test

import (
	"testing"

	"github.com/txmq/txmq/internal/txmqtest"
)

func TestMain(m *testing.M) { txmqtest.VerifyTestMain(m) }
