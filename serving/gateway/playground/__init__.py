"""The playground: a chat page at `/playground`, served by the gateway from package files.

    playground = Playground.load()                # the files in `static/`, read once
    await playground.serve(scope, send, request_id=rid)

The page needs no key to load; the API calls its script makes send the key the user pastes
(`Authorization: Bearer`), which stays in the browser tab (`sessionStorage`).
"""

from serving.gateway.playground.assets import PLAYGROUND_PATH, Asset, Playground

__all__ = ["PLAYGROUND_PATH", "Asset", "Playground"]
