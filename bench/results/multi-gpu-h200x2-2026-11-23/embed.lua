wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[{"model": "minilm-fp16", "input": ["Sentence 1 of the load: streams, events and a caching allocator.","Sentence 2 of the load: streams, events and a caching allocator.","Sentence 3 of the load: streams, events and a caching allocator.","Sentence 4 of the load: streams, events and a caching allocator.","Sentence 5 of the load: streams, events and a caching allocator.","Sentence 6 of the load: streams, events and a caching allocator.","Sentence 7 of the load: streams, events and a caching allocator.","Sentence 8 of the load: streams, events and a caching allocator."]}]]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %.1f %.3f %.3f %d\n", summary.requests,
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, e.connect + e.read + e.write + e.status + e.timeout))
end
