# Screenshot a page after N real seconds through Chromium's DevTools protocol
# (headless --screenshot runs on virtual time, so a live dashboard would show
# only a second or two). Made the README's docs/img/dashboard.png:
#   python3 scripts/dashboard-shot.py http://127.0.0.1:9466/ dashboard.png 12
# Needs chromium and the websocket-client package (pip install websocket-client).
import base64, json, subprocess, sys, tempfile, time, urllib.request

import websocket
url, out, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])
p = subprocess.Popen(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,760", "--remote-debugging-port=9333", "--user-data-dir=" + tempfile.mkdtemp(), url], stderr=subprocess.DEVNULL)
try:
    for _ in range(100):
        try:
            tabs = json.load(urllib.request.urlopen("http://127.0.0.1:9333/json")); break
        except Exception: time.sleep(0.1)
    time.sleep(wait)
    ws = websocket.create_connection([t for t in tabs if t["type"] == "page"][0]["webSocketDebuggerUrl"])
    ws.send(json.dumps({"id": 1, "method": "Page.captureScreenshot", "params": {"format": "png"}}))
    while True:
        m = json.loads(ws.recv())
        if m.get("id") == 1: break
    open(out, "wb").write(base64.b64decode(m["result"]["data"]))
finally:
    p.kill()
