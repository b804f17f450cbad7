-- Nothing of its own: the endings in the prelude are the whole call (QuotaStore.finish of a
-- lease this replica did not issue, and the queue's flush when no other call comes).
-- Reply: {endings found ended already, {}}.
return answer({})
