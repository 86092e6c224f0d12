import json, urllib.request, time, sys
n=int(sys.argv[1])
tree = "".join(f"- Button w{i*7%101} item {i}\n" for i in range(n))
body = {"model":"cua-s1-4b-0.2","state":tree,"questions":{"q":{"type":"choice","instructions":"pick","criteria":{"a":"Open","b":"Close"}}}}
req = urllib.request.Request("http://127.0.0.1:8011/v1/systemone", data=json.dumps(body).encode(), headers={"content-type":"application/json"})
t=time.time()
try:
    r = json.load(urllib.request.urlopen(req)); print(r["answers"]["q"]["probabilities"], r["usage"])
except urllib.error.HTTPError as e:
    print(e.code, e.read()[:200])
print("s", round(time.time()-t,2))
