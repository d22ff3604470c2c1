# frozen_string_literal: true

require "spec_helper"

RSpec.describe TopologyClaims::Client do
  let(:cell) { SpecSupport.cell(:sqlite, "a") }
  let(:claim) do
    name = unique("direct")
    { claim_type: :CLAIM_TYPE_USERNAME, claim_value: name, owner: :OWNER_USER, owner_value: "7",
      table_name: :TABLE_NAME_USERS, table_record_id: 7 }
  end

  it "returns the same lease for a retry under the same client-chosen lease id" do
    id = SecureRandom.uuid
    first = cell.client.begin_update(creates: [claim], lease_id: id)
    again = cell.client.begin_update(creates: [claim], lease_id: id)
    expect(again.lease_payload.lease_id).to eq(id)
    expect(again.lease_payload.created_at).to eq(first.lease_payload.created_at)
    cell.client.rollback_update(id)
  end

  # The real stub, but the first BeginUpdate is lost: the caller hears UNAVAILABLE at once, and
  # the request reaches the server `hold` seconds later (as from a server's group-commit queue),
  # its answer kept in `late`.
  class LosingStub
    attr_reader :late

    def initialize(real, hold)
      @real = real
      @hold = hold
      @late = Queue.new
      @lost = false
    end

    def begin_update(request, **options)
      return @real.begin_update(request, **options) if @lost

      @lost = true
      Thread.new do
        sleep @hold
        @late << begin
          @real.begin_update(request, deadline: Time.now + 5)
        rescue GRPC::BadStatus => e
          e
        end
      end
      raise GRPC::Unavailable, "the first attempt is lost (held by the spec)"
    end

    def method_missing(name, *args, **options, &block) = @real.public_send(name, *args, **options, &block)
    def respond_to_missing?(name, include_private = false) = @real.respond_to?(name, include_private) || super
  end

  it "fences the lease id of a BeginUpdate refused after a lost attempt, so the lost one leases nothing" do
    other = SpecSupport.cell(:sqlite, "b")
    other.client.commit_update(other.client.begin_update(creates: [claim]).lease_payload.lease_id)
    destroy = other.client.begin_update(destroys: [claim]).lease_payload.lease_id
    client = cell.client
    real = client.send(:stub_for_this_process, :claims)
    losing = LosingStub.new(real, 1.0)
    stubs = client.instance_variable_get(:@stubs)
    stubs[:claims] = losing
    begin
      expect { client.begin_update(creates: [claim]) }.to raise_error(TopologyClaims::ClaimLeased)
    ensure
      stubs[:claims] = real
    end
    other.client.commit_update(destroy) # the claim is free before the lost attempt lands
    late = Timeout.timeout(10) { losing.late.pop }
    expect(late).to be_a(GRPC::BadStatus)
    expect(TopologyClaims::Status.to_error(late, "the late BeginUpdate")).to be_a(TopologyClaims::LeaseRolledBack)
    expect(lookup(cell, :username, claim[:claim_value])).to be_nil
  end

  it "types errors from ErrorInfo, naming the claim" do
    cell.client.commit_update(cell.client.begin_update(creates: [claim]).lease_payload.lease_id)
    other = SpecSupport.cell(:sqlite, "b")
    expect { other.client.begin_update(creates: [claim]) }.to raise_error(TopologyClaims::ClaimTaken) { |e|
      expect([e.claim_type, e.claim_value, e.code]).to eq(["username", claim[:claim_value], "ALREADY_EXISTS"])
      expect(e.message).to include(claim[:claim_value])
    }
    expect { other.client.begin_update(destroys: [claim]) }.to raise_error(TopologyClaims::NotClaimOwner)
    expect { other.client.commit_update(SecureRandom.uuid) }.to raise_error(TopologyClaims::LeaseError)
  end

  it "announces each call as a call.topology_claims notification with method, duration and code" do
    events = []
    sub = ActiveSupport::Notifications.subscribe("call.topology_claims") { |*, payload| events << payload }
    cell.client.outstanding_leases
    ActiveSupport::Notifications.unsubscribe(sub)
    expect(events.last).to include(method: "ListOutstandingLeases", code: "OK", attempts: 1)
    expect(events.last[:duration]).to be_a(Float)
  end

  it "trips the circuit breaker at max_claims_per_second, with a metric, without calling" do
    limited = TopologyClaims::Client.new(cell.config.dup_with(max_claims_per_second: 1))
    limited.begin_update(creates: [claim]).then { |r| limited.rollback_update(r.lease_payload.lease_id) }
    before = TopologyClaims.metrics.get(:circuit_open, :max_claims_per_second)
    expect { limited.begin_update(creates: [claim.merge(claim_value: unique("second"))]) }
      .to raise_error(TopologyClaims::CircuitOpen, /max_claims_per_second/) { |e| expect(e.limit).to eq(:max_claims_per_second) }
    expect(TopologyClaims.metrics.get(:circuit_open, :max_claims_per_second)).to eq(before + 1)
  end
end

RSpec.describe TopologyClaims::Configuration do
  it "reads the sidecars' environment variables, with documented defaults" do
    config = described_class.new("TOPOLOGY_CLAIMS_SERVER" => "https://claims:443", "TOPOLOGY_CLAIMS_CELL_ID" => "c1",
                                 "TOPOLOGY_CLAIMS_CALL_TIMEOUT" => "500ms", "TOPOLOGY_CLAIMS_CLIENT_TLS_CA" => "/ca.pem")
    expect([config.address, config.cell_id, config.timeout, config.tls]).to eq(["https://claims:443", "c1", 0.5, { ca: "/ca.pem" }])
    defaults = described_class.new({})
    expect([defaults.address, defaults.in_transaction_deadline, defaults.staleness]).to eq(["http://127.0.0.1:50051", 0.2, 600.0])
  end

  it "names the variable that is malformed" do
    expect { described_class.new("TOPOLOGY_CLAIMS_STALENESS" => "ten") }
      .to raise_error(TopologyClaims::ConfigurationError, /TOPOLOGY_CLAIMS_STALENESS="ten"/)
  end
end
