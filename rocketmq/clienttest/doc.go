// Package clienttest tests txmq's RocketMQ front end (package rocketmq)
// with the real github.com/apache/rocketmq-client-go/v2: a module of its
// own, so that the root go.mod does not take the RocketMQ client.
package clienttest
