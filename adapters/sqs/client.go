package sqs

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/smithy-go"
)

// Connection says how to reach SQS. Credentials always come from the AWS
// SDK's default chain (environment, shared config and credentials files,
// SSO, web identity, ECS or EC2 roles) or from AWS when set; the adapter
// never logs them nor puts them in an error or a dead letter.
type Connection struct {
	// Region is the AWS region. Empty: the region of a queue URL of the form
	// https://sqs.REGION.amazonaws.com/…, else the default chain's
	// (AWS_REGION, the shared config).
	Region string
	// Endpoint overrides the SQS endpoint the API calls go to
	// ("http://127.0.0.1:9324" for an emulator). Empty: AWS's endpoint for
	// the region (or AWS_ENDPOINT_URL_SQS).
	Endpoint string
	// TLS, when set, is the TLS configuration of the HTTPS connections to
	// SQS. Nil: Go's defaults (the system's CA certificates).
	TLS *tls.Config
	// AWS, when set, is the AWS configuration to use (credentials, retryer,
	// HTTP client) instead of loading the default chain's; Region, Endpoint
	// and TLS are still applied over it.
	AWS *aws.Config
}

// newClient returns an SQS client for queueURL.
func (c Connection) newClient(ctx context.Context, queueURL string) (*sqs.Client, error) {
	var cfg aws.Config
	if c.AWS != nil {
		cfg = c.AWS.Copy()
	} else {
		var err error
		cfg, err = config.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("sqs: load the AWS configuration: %w", err)
		}
	}
	switch {
	case c.Region != "":
		cfg.Region = c.Region
	case regionOf(queueURL) != "":
		cfg.Region = regionOf(queueURL)
	}
	if cfg.Region == "" {
		return nil, errors.New("sqs: no AWS region: set Region (URL parameter region), AWS_REGION, or use a queue URL https://sqs.REGION.amazonaws.com/…")
	}
	if c.TLS != nil {
		cfg.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.TLSClientConfig = c.TLS
		})
	}
	return sqs.NewFromConfig(cfg, func(o *sqs.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(c.Endpoint)
		}
	}), nil
}

// regionOf returns REGION of a queue URL https://sqs.REGION.amazonaws.com/…
// (or amazonaws.com.cn), or "".
func regionOf(queueURL string) string {
	u, err := url.Parse(queueURL)
	if err != nil {
		return ""
	}
	host := u.Hostname()
	rest, ok := strings.CutPrefix(host, "sqs.")
	if !ok {
		return ""
	}
	region, _, ok := strings.Cut(rest, ".amazonaws.com")
	if !ok || region == "" || strings.Contains(region, ".") {
		return ""
	}
	return region
}

// queueName returns the queue name of a queue URL: its last path segment.
func queueName(queueURL string) string {
	u, err := url.Parse(queueURL)
	if err != nil {
		return queueURL
	}
	p := strings.TrimSuffix(u.Path, "/")
	return p[strings.LastIndexByte(p, '/')+1:]
}

// checkQueueURL returns an error unless s is an absolute http(s) URL with
// a host and a path naming the queue, and no user info.
func checkQueueURL(field, s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("sqs: %s is not a URL", field)
	case u.User != nil:
		return fmt.Errorf("sqs: %s holds user info; credentials come from the AWS chain", field)
	case u.Scheme != "https" && u.Scheme != "http" || u.Host == "":
		return fmt.Errorf("sqs: %s %q: want https://sqs.REGION.amazonaws.com/ACCOUNT/QUEUE", field, s)
	case queueName(s) == "":
		return fmt.Errorf("sqs: %s %q names no queue", field, s)
	}
	return nil
}

// isFIFO reports whether the queue of queueURL is a FIFO queue.
func isFIFO(queueURL string) bool { return strings.HasSuffix(queueName(queueURL), ".fifo") }

// receiptGone reports whether err (or a batch entry's code) says a receipt
// handle no longer names a message this consumer holds: invalid or
// expired, the message not in flight, or (for ChangeMessageVisibility and
// DeleteMessage, whose only other parameters are the queue and a timeout
// the adapter bounds) an invalid parameter value.
func receiptGone(code string) bool {
	switch code {
	case "ReceiptHandleIsInvalid", "AWS.SimpleQueueService.MessageNotInflight", "MessageNotInflight", "InvalidParameterValue":
		return true
	}
	return false
}

// errorCode returns the API error code of err, or "".
func errorCode(err error) string {
	if ae, ok := errors.AsType[smithy.APIError](err); ok {
		return ae.ErrorCode()
	}
	return ""
}
