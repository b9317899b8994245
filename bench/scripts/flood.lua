-- wrk script: one author ("flood") posting a new text per request, as a
-- spam flood from one account does (README, "A bounded history per
-- evaluation"): wrk -t1 -c32 -d20s -s bench/scripts/flood.lua http://HOST
local n = 0
local tag = os.time() .. math.floor(os.clock()*1000000)
request = function()
  n = n + 1
  local body = string.format('{"kind":"post","author":"flood","text":"flood post %s-%d"}', tag, n)
  return wrk.format("POST", "/v1/items", {["Content-Type"] = "application/json", ["Authorization"] = "Bearer bench-client-token-0123456789abcdef"}, body)
end
