# frozen_string_literal: true

require "spec_helper"

RSpec.describe "examples/ruby-cell" do
  it "runs in one command against topology-claims serve" do
    script = File.expand_path("../../../examples/ruby-cell/run.sh", __dir__)
    out, err, status = Timeout.timeout(120) do
      Open3.capture3(TopologyClaims::Testing.clean_env.merge("TOPOLOGY_CLAIMS_BIN" => TopologyClaims::Testing.binary), script)
    end
    expect(status).to be_success, out + err
    expect(out).to include("cell-us: form errors for alice <alice@example.org>:\n  - Username has already been taken")
    expect(out).to include("cell-us: signed up alice3 <alice@example.com>")
    expect(out).to match(/verify cell-eu: .* missing=0 different=0 extra=0 /)
  end
end
