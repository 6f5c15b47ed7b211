package envoyrls

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata is a response's dynamic_metadata, as the peer's
// RESPONSE_DYNAMIC_METADATA writes it: "domain"; "descriptors", each with
// its "entries" as "key=value" strings, its "limit" when it carries one and
// its "hitsAddend" when set; the request's "hitsAddend" when not 0; and
// "metadata", the metadata of the rules of the descriptors that passed,
// merged (the first of two same-named fields stays, structs merge).
// checks is nil for a domain with no configuration.
func dynamicMetadata(req *rlsv3.RateLimitRequest, checks []check) *structpb.Struct {
	descs := make([]*structpb.Value, 0, len(req.Descriptors))
	for _, d := range req.Descriptors {
		entries := make([]*structpb.Value, len(d.Entries))
		for i, e := range d.Entries {
			entries[i] = structpb.NewStringValue(e.Key + "=" + e.Value)
		}
		f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
		if d.Limit != nil {
			f["limit"] = structpb.NewStringValue(d.Limit.String())
		}
		if d.HitsAddend != nil {
			f["hitsAddend"] = structpb.NewNumberValue(float64(d.HitsAddend.Value))
		}
		descs = append(descs, structpb.NewStructValue(&structpb.Struct{Fields: f}))
	}
	fields := map[string]*structpb.Value{
		"domain":      structpb.NewStringValue(req.Domain),
		"descriptors": structpb.NewListValue(&structpb.ListValue{Values: descs}),
	}
	if req.HitsAddend != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(req.HitsAddend))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range checks {
		c := &checks[i]
		if c.rule == nil || c.replaced || c.rule.Unlimited || c.rule.metadata == nil {
			continue
		}
		if c.bucket != nil && !c.fits && !c.bucket.shadow {
			continue
		}
		mergeStruct(passed, c.rule.metadata)
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

// mergeStruct adds src's fields to dst: a field dst lacks is copied, and
// two structs under one name are merged; otherwise dst's stays.
func mergeStruct(dst, src *structpb.Struct) {
	for k, v := range src.Fields {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if ds, ss := have.GetStructValue(), v.GetStructValue(); ds != nil && ss != nil {
			mergeStruct(ds, ss)
		}
	}
}
