# frozen_string_literal: true

require "spec_helper"

RSpec.describe "a stalled server" do
  it "makes a save raise Unavailable within the deadline, never hang, write nothing, and leaves nothing the reconciler does not heal" do
    server = SpecSupport.server
    cell = Cells.build(adapter: :sqlite, name: "stalled", cell_id: "rb-stalled-#{SpecSupport.run_id}",
                       database: File.join(SpecSupport::TMP, "stalled.sqlite3"), address: server.url,
                       config: { in_transaction_deadline: 0.3, timeout: 0.5, breaker_failures: 0 })
    cell.client.outstanding_leases # connected before the stall
    name = unique("stalled")
    Process.kill(:STOP, server.pid)
    begin
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      expect { cell.user.create!(username: name) }.to raise_error(TopologyClaims::Unavailable, /deadline 0\.3s/)
      # 0.3 s for BeginUpdate, then one best-effort RollbackUpdate of at most `timeout`.
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 2.0
    ensure
      Process.kill(:CONT, server.pid)
    end
    expect(cell.user.where(username: name)).to be_empty
    expect(cell.leases_outstanding).to eq(0)

    # Whatever the resumed server made of the abandoned requests, the reconciler settles it.
    sleep 1.1
    _stdout, stderr, status = sidecar(cell, "reconcile", "--once", "--staleness", "1s")
    expect(status).to be_success, stderr
    expect(lookup(cell, :username, name)).to be_nil
    expect(cell.client.outstanding_leases).to be_empty
  end
end
