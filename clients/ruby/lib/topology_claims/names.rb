# frozen_string_literal: true

module TopologyClaims
  # The gem's lowercase names (:username, :user, :users) for the proto's enum values
  # (CLAIM_TYPE_USERNAME, OWNER_USER, TABLE_NAME_USERS), read from the generated enums so a
  # value added to the proto is accepted without a change here.
  module Names
    module_function

    def claim_type(name) = value(V1::ClaimRecord::ClaimType, "CLAIM_TYPE_", name, "claim type")

    # The built-in namespaces the legacy claim types stand for (ClaimRecord.claim_type 1, 2, 3).
    BUILTIN_NAMESPACES = { "routes" => "routes", "username" => "usernames", "email" => "emails" }.freeze

    # The namespace a legacy `type:` (:username, :email, :routes) stands for; nil for nil.
    def namespace_of_type(type)
      return nil if type.nil?

      claim_type(type) # refuses an unknown type, listing the known ones
      BUILTIN_NAMESPACES.fetch(type.to_s.downcase)
    end
    def owner(name) = value(V1::ClaimRecord::Owner, "OWNER_", name, "owner type")
    def table_name(name) = value(V1::ClaimRecord::TableName, "TABLE_NAME_", name, "table name")

    # The lowercase name of a proto enum symbol (:CLAIM_TYPE_EMAIL => "email").
    def short(symbol)
      symbol.to_s.sub(/\A(CLAIM_TYPE|OWNER|TABLE_NAME|CLAIM_STATE)_/, "").downcase
    end

    def value(enum, prefix, name, what)
      symbol = :"#{prefix}#{name.to_s.upcase}"
      return symbol if enum.resolve(symbol) && !symbol.to_s.end_with?("UNSPECIFIED")

      allowed = enum.constants.map(&:to_s).grep(/\A#{prefix}/).reject { |c| c.end_with?("UNSPECIFIED") }
                    .map { |c| c.delete_prefix(prefix).downcase }
      raise ArgumentError, "#{name.inspect} is not a #{what} of topology.claims.v1 (one of #{allowed.join(', ')})"
    end
  end
end
