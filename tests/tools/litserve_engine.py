"""A LitServe (PyPI litserve) inference server on CPU, the third-party engine of tests/third_party.rs.
Requests {"tokens": N} are batched (up to 4); predict's work grows with the batch's tokens, like a
model's forward pass. Nothing in it knows of stallscope. Usage: python litserve_engine.py PORT"""
import sys

import litserve as ls


class TokenAPI(ls.LitAPI):
    def setup(self, device):
        self.row = list(range(64))

    def decode_request(self, request):
        return int(request["tokens"])

    def predict(self, xs):
        # Python work in proportion to the batch's tokens, like a forward pass over its context:
        # ~0.1 ms per token on one core, a batch of 3 x 72 tokens ~20 ms.
        total = 0
        for n in xs:
            for _ in range(n * 160):
                total += sum(self.row)
        return [total for _ in xs]

    def encode_response(self, output):
        return {"out": output}


if __name__ == "__main__":
    api = TokenAPI(max_batch_size=4, batch_timeout=0.002)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=1, timeout=60)
    server.run(host="127.0.0.1", port=int(sys.argv[1]), generate_client_file=False, log_level="warning")
